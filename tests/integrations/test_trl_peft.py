"""DPH-RL and Lp-Reg under PEFT / LoRA: ``peft_config=LoraConfig(...)`` given to the trainer,
which wraps the model with PEFT itself, as TRL users do (tiny Llama on CPU, fp32). The proxy
is projected from the PEFT model's backbone through its head (a trainable copy of it with
``modules_to_save``), the reference store is checked against the base model, and training
moves the adapter's weights only."""

from __future__ import annotations

import pytest
import torch
from trl_helpers import (
    PROMPTS,
    make_args,
    prompt_dataset,
    tiny_model,
    tiny_tokenizer,
    varied_reward,
)

trl = pytest.importorskip("trl")
peft = pytest.importorskip("peft")

from divrl.algorithms import minp_log_normalizer, proxy_log_prob, token_log_probs  # noqa: E402
from divrl.data.reference_store import (  # noqa: E402
    ReferenceStore,
    ReferenceStoreError,
    StoreMismatchError,
    write_reference_store,
)
from divrl.integrations.trl import LOG_Z_KEY, PROXY_KEY, DivRLGRPOTrainer  # noqa: E402

torch.set_num_threads(1)


def lora(head: bool = False, random_b: bool = False):
    """LoRA on the attention's q and v projections; ``head``: the LM head trained whole
    beside them (``modules_to_save``); ``random_b``: B not zero, so the adapter changes the
    model's outputs from the start."""
    return peft.LoraConfig(
        task_type="CAUSAL_LM",
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj"],
        modules_to_save=["lm_head"] if head else None,
        init_lora_weights=not random_b,
    )


def build(args, peft_config, cls=DivRLGRPOTrainer, model=None):
    return cls(
        model=model if model is not None else tiny_model(0),
        reward_funcs=varied_reward,
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tiny_tokenizer(),
        peft_config=peft_config,
    )


def rollout_batch(trainer) -> dict:
    """One generation batch through TRL's rollout code (old log-probs: num_iterations 2)."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    rows = [{"prompt": p} for p in PROMPTS[:2] for _ in range(trainer.args.num_generations)]
    return trainer._generate_and_score_completions(rows)


def plain_proxy(model, inputs, kappa: float) -> tuple[torch.Tensor, ...]:
    """Log-prob, proxy and log Z of the completions from ``model``'s own logits forward."""
    model.eval()
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    k = inputs["completion_ids"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -(k + 1) : -1]
    model.train()
    tokens = inputs["completion_ids"]
    return (
        token_log_probs(logits, tokens),
        proxy_log_prob(logits, tokens, kappa),
        minp_log_normalizer(logits, kappa),
    )


def split_params(model) -> tuple[dict, dict]:
    """(trainable, frozen) parameters of the PEFT model by name, copied."""
    trainable, frozen = {}, {}
    for name, p in model.named_parameters():
        (trainable if p.requires_grad else frozen)[name] = p.detach().clone()
    return trainable, frozen


def assert_only_the_adapter_moved(trainer, before: tuple[dict, dict]) -> None:
    trainable, frozen = split_params(trainer.model)
    assert trainable and all("lora_" in n for n in trainable)  # TRL wrapped it in LoRA
    assert set(trainable) == set(before[0]) and set(frozen) == set(before[1])
    assert any(not torch.equal(trainable[n], before[0][n]) for n in trainable)
    for name, value in frozen.items():
        assert torch.equal(value, before[1][name]), name


# ----------------------------------------------------------------------------- Lp-Reg


@pytest.mark.parametrize("head", [False, True], ids=["lora", "lora+trained-head"])
def test_lp_reg_proxy_reads_the_peft_models_backbone_and_head(tmp_path, head):
    """With the adapter changing the outputs (B != 0; with ``modules_to_save`` the trained
    copy of the head perturbed too): where the min-p filter keeps every token the proxy is
    TRL's own log-prob, and with kappa 0.02 it is the proxy of the PEFT model's own logits,
    not of the base model's (adapters disabled)."""
    for kappa in (0.0, 0.02):
        args = make_args(tmp_path, lp_reg=True, loss_options={"kappa": kappa}, num_iterations=2)
        trainer = build(args, lora(head=head, random_b=True))
        model = trainer.model
        assert isinstance(model, peft.PeftModel)
        if head:
            copy = model.get_output_embeddings().modules_to_save["default"]
            with torch.no_grad():
                copy.weight.add_(0.5 * torch.randn_like(copy.weight))
        batch = rollout_batch(trainer)
        valid = batch["completion_mask"].bool()
        lp, proxy, log_z = plain_proxy(model, batch, kappa)
        torch.testing.assert_close(batch["old_per_token_logps"][valid], lp[valid])
        torch.testing.assert_close(batch[PROXY_KEY][valid], proxy[valid], rtol=0, atol=1e-5)
        torch.testing.assert_close(batch[LOG_Z_KEY][valid], log_z[valid], rtol=0, atol=1e-5)
        if kappa == 0.0:
            assert torch.all(batch[LOG_Z_KEY][valid] == 0.0)
            torch.testing.assert_close(
                batch[PROXY_KEY][valid], batch["old_per_token_logps"][valid], rtol=0, atol=1e-5
            )
        else:
            assert torch.any(batch[LOG_Z_KEY][valid] < -1e-3)  # the filter dropped tokens
        with model.disable_adapter():
            _, base_proxy, _ = plain_proxy(model, batch, kappa)
        assert (batch[PROXY_KEY][valid] - base_proxy[valid]).abs().max() > 1e-2


def test_lp_reg_trains_the_lora_weights_only(tmp_path):
    args = make_args(
        tmp_path, lp_reg=True, loss_options={"rho": 0.5}, epsilon=1.0, epsilon_high=9.0
    )
    trainer = build(args, lora())
    before = split_params(trainer.model)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2
    assert sum(h["divrl/lp_reg/num_selected"] for h in steps) > 0
    assert all(0.0 < h["divrl/lp_reg/mean_z"] <= 1.0 for h in steps)
    assert_only_the_adapter_moved(trainer, before)


# ----------------------------------------------------------------------------- DPH-RL


def test_dph_js_trains_the_lora_weights_only(tmp_path, store):
    """The store holds the base model's log-probs and LoRA starts as the identity (B = 0):
    u = 1 at step 1, so the reference samples are scored by the PEFT model at the right
    positions; the divergence grows as the adapter trains."""
    args = make_args(
        tmp_path,
        divergence="js",
        divergence_coef=0.2,
        reference_store=str(store),
        reference_batch_size=2,
    )
    trainer = build(args, lora())
    before = split_params(trainer.model)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2 and all("divrl/dph/divergence" in h for h in steps)
    assert steps[0]["divrl/dph/u_mean"] == pytest.approx(1.0, abs=1e-5)
    assert steps[-1]["divrl/dph/divergence"] > 0.0
    assert_only_the_adapter_moved(trainer, before)


def test_zero_coefficient_trains_as_grpo_trainer_under_lora(tmp_path, store):
    """DPH-JS with coefficient 0 and Lp-Reg off: the losses and adapter weights of
    GRPOTrainer under the same LoRA config and seed (gradient accumulation 2, num_iterations
    2)."""
    common = dict(gradient_accumulation_steps=2, num_iterations=2, max_steps=2)
    dph = dict(divergence="js", divergence_coef=0.0, reference_store=str(store))
    runs = []
    for cls, extra in ((trl.GRPOTrainer, {}), (DivRLGRPOTrainer, dph)):
        trainer = build(make_args(tmp_path / cls.__name__, **common, **extra), lora(), cls)
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        runs.append((trainer, losses, split_params(trainer.model)[0]))
    (_, plain_losses, plain_lora), (adapter, losses, adapter_lora) = runs
    assert len(losses) == len(plain_losses) == 2
    assert losses == pytest.approx(plain_losses, abs=1e-7)
    assert set(adapter_lora) == set(plain_lora)
    for name, value in adapter_lora.items():
        torch.testing.assert_close(value, plain_lora[name], rtol=0, atol=1e-7)
    assert any("divrl/dph/divergence" in h for h in adapter.state.log_history)


def test_store_checks_read_the_base_model(tmp_path, store):
    """Under peft_config the store is checked against the base model: its fingerprint (a
    model loaded from a folder) and its vocabulary."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from divrl.data.fingerprint import model_fingerprint

    samples = ReferenceStore(store)
    rows = [
        dict(zip(samples.prompts, r, strict=True))
        for r in zip(*samples.prompts.values(), strict=True)
    ]

    def args_with(fingerprint: str):
        manifest = {**samples.manifest, "fingerprint": {"model": fingerprint}}
        path = write_reference_store(
            tmp_path / "s", samples.samples, rows, manifest, overwrite=True
        )
        return make_args(tmp_path, divergence="js", reference_store=str(path))

    folder, other = tmp_path / "model", tmp_path / "other"
    tiny_model(0).save_pretrained(folder)
    tiny_model(7).save_pretrained(other)
    load = lambda: AutoModelForCausalLM.from_pretrained(folder)  # noqa: E731
    build(args_with(model_fingerprint(folder)), lora(), model=load())  # the same model: passes
    with pytest.raises(StoreMismatchError, match="model"):
        build(args_with(model_fingerprint(other)), lora(), model=load())
    config = tiny_model(0).config.to_dict()
    config["vocab_size"] = 8  # the store's digits are ids 3..15
    small = LlamaForCausalLM(LlamaConfig(**config))
    with pytest.raises(ReferenceStoreError, match="token ids"):
        build(make_args(tmp_path, divergence="js", reference_store=str(store)), lora(), model=small)
