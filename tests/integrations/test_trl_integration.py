"""DPH-RL and Lp-Reg inside TRL's GRPOTrainer (tiny Llama on CPU, fp32)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trl_helpers import (
    PROMPTS,
    count_ones_reward,
    make_args,
    prompt_dataset,
    tiny_model,
    varied_reward,
)

trl = pytest.importorskip("trl")

from divrl.algorithms import (  # noqa: E402
    lp_reg_loss,
    lp_reg_selection,
    minp_log_normalizer,
    proxy_log_prob,
    reference_divergence_loss,
    token_log_probs,
)
from divrl.data.reference_store import ReferenceStore  # noqa: E402
from divrl.data.sampling import EpochSampler  # noqa: E402
from divrl.integrations import trl as integration  # noqa: E402
from divrl.integrations.trl import (  # noqa: E402
    LOG_Z_KEY,
    PROXY_KEY,
    REQUIRED_INPUT_KEYS,
    REQUIRED_TRAINER_ATTRIBUTES,
    DivRLGRPOConfig,
    DivRLGRPOTrainer,
    check_trl_internals,
    check_trl_version,
)

torch.set_num_threads(1)


def build(trainer_cls, args, tokenizer, model=None):
    trainer = trainer_cls(
        model=model if model is not None else tiny_model(0),
        reward_funcs=varied_reward,
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tokenizer,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return trainer


def rollout_batch(trainer, seed: int = 0) -> dict:
    """One generation batch through TRL's own rollout, reward and advantage code."""
    torch.manual_seed(seed)
    rows = [{"prompt": p} for p in PROMPTS[:2] for _ in range(trainer.args.num_generations)]
    return trainer._generate_and_score_completions(rows)


def loss_and_grads(trainer, inputs) -> tuple[float, list[torch.Tensor]]:
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grads = [p.grad.clone() for p in trainer.model.parameters()]
    trainer.model.zero_grad()
    return float(loss.detach()), grads


def full_forward(model, inputs, temperature=1.0, kappa=0.02):
    """Per-token log-prob, proxy and log Z of the completions from a plain logits forward
    (in eval mode: HF skips the gradient checkpointing TRL turns on; dropout is off)."""
    model.eval()
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    k = inputs["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -(k + 1) : -1]
    model.train()
    tokens = inputs["completion_ids"]
    return (
        token_log_probs(logits, tokens, temperature),
        proxy_log_prob(logits, tokens, kappa, temperature),
        minp_log_normalizer(logits, kappa, temperature),
    )


# ----------------------------------------------------------------------------- config


def test_config_validation_messages(tmp_path, store):
    with pytest.raises(ValueError, match="needs a reference store"):
        make_args(tmp_path, divergence="js")
    with pytest.raises(ValueError, match=r"set beta=0\.0"):
        make_args(tmp_path, divergence="js", reference_store=str(store), beta=0.01)
    with pytest.raises(ValueError, match="unknown divergence"):
        make_args(tmp_path, divergence="no_such_divergence", reference_store=str(store))
    with pytest.raises(ValueError, match="0 < alpha < 1"):
        make_args(tmp_path, divergence="alpha", reference_store=str(store), divergence_alpha=1.5)
    with pytest.raises(ValueError, match="set divergence"):
        make_args(tmp_path, reference_store=str(store))
    with pytest.raises(ValueError, match="divergence_coef"):
        make_args(tmp_path, divergence="js", reference_store=str(store), divergence_coef=-1.0)
    with pytest.raises(ValueError, match="reference_batch_size"):
        make_args(tmp_path, divergence="js", reference_store=str(store), reference_batch_size=0)
    with pytest.raises(ValueError, match="clipped-surrogate loss_type"):
        make_args(tmp_path, lp_reg=True, loss_type="sapo")
    with pytest.raises(ValueError, match="set delta=None"):
        make_args(tmp_path, lp_reg=True, delta=3.0)
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        make_args(tmp_path, lp_reg=True, top_entropy_quantile=0.2)
    with pytest.raises(ValueError, match=r"loss_options: .*kappa=2\.0 must be in \[0, 1\]"):
        make_args(tmp_path, lp_reg=True, loss_options={"kappa": 2.0})
    with pytest.raises(ValueError, match=r"loss_options: .*rho=1\.5 must be in \[0, 1\]"):
        make_args(tmp_path, lp_reg=True, loss_options={"rho": 1.5})
    with pytest.raises(ValueError, match=r"through TRL's \['epsilon'\]"):
        make_args(tmp_path, lp_reg=True, loss_options={"clip_low": 0.2})
    with pytest.raises(ValueError, match="set policy_loss"):
        make_args(tmp_path, loss_options={"rho": 0.5})
    with pytest.raises(ValueError, match="lp_reg's options here"):
        make_args(tmp_path, lp_reg=True, loss_options={"lp_reg_rho": 0.5})
    with pytest.raises(ValueError, match="neither `divrl train` nor the TRL adapter"):
        make_args(tmp_path, lp_reg=True, loss_options={"full_vocab": True})
    assert (
        make_args(tmp_path, lp_reg=True, loss_options={"min_k": 1}).policy_loss_options.min_k == 1
    )
    with pytest.raises(ValueError, match="divergence_weighting"):
        make_args(tmp_path, divergence="js", reference_store=str(store), divergence_weighting="x")
    args = make_args(tmp_path, divergence="alpha", divergence_alpha=0.5, reference_store=str(store))
    assert args.divergence == "alpha" and args.beta == 0.0
    # every added field carries help text, like TRL's own
    added = {f.name for f in dataclasses.fields(DivRLGRPOConfig)} - {
        f.name for f in dataclasses.fields(trl.GRPOConfig)
    }
    assert added == {
        "divergence",
        "divergence_coef",
        "divergence_alpha",
        "divergence_weighting",
        "reference_store",
        "reference_batch_size",
        "allow_store_mismatch",
        "rollout_prompts",
        "rehearsal_control",
        "advantage",
        "max_unscorable",
        "policy_loss",
        "lp_reg",
        "loss_options",
    }
    assert all(DivRLGRPOConfig.__dataclass_fields__[f].metadata.get("help") for f in added)


def test_advantage_sets_trls_scale_or_is_refused(tmp_path):
    for name, scale in (("grpo", "group"), ("grpo_batch", "batch"), ("dr_grpo", "none")):
        assert make_args(tmp_path, advantage=name).scale_rewards == scale
    assert make_args(tmp_path, advantage="dr_grpo", scale_rewards="none").scale_rewards == "none"
    for name in ("rloo", "gpg", "grpo_passk"):
        with pytest.raises(ValueError, match=f"advantage='{name}': TRL's GRPOTrainer computes"):
            make_args(tmp_path, advantage=name)
    with pytest.raises(ValueError, match="keep one"):
        make_args(tmp_path, advantage="dr_grpo", scale_rewards="batch")
    with pytest.raises(ValueError, match="use one of"):
        make_args(tmp_path, advantage="nope")


def test_trainer_rejects_plain_config_and_mismatched_store(tmp_path, tokenizer, store):
    plain = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[])
    with pytest.raises(TypeError, match="DivRLGRPOConfig"):
        build(DivRLGRPOTrainer, plain, tokenizer)
    hot = make_args(tmp_path, divergence="js", reference_store=str(store), temperature=0.7)
    with pytest.raises(ValueError, match="temperature"):
        build(DivRLGRPOTrainer, hot, tokenizer)
    missing = make_args(tmp_path, divergence="js", reference_store=str(tmp_path / "none"))
    with pytest.raises(FileNotFoundError, match="presample"):
        build(DivRLGRPOTrainer, missing, tokenizer)


# ----------------------------------------------------------------------------- TRL guard


def test_trl_version_check(monkeypatch):
    from packaging.version import Version

    assert Version(trl.__version__) in integration.TESTED_TRL_VERSIONS
    check_trl_version()
    monkeypatch.delenv(integration.ALLOW_UNTESTED_ENV, raising=False)
    with pytest.raises(RuntimeError, match="tested with trl"):
        check_trl_version("1.17.0")
    with pytest.raises(RuntimeError, match="tested with trl"):
        check_trl_version("0.20.0")
    monkeypatch.setenv(integration.ALLOW_UNTESTED_ENV, "1")
    with pytest.warns(UserWarning, match="tested with trl"):
        check_trl_version("1.17.0")


def test_trl_internals_the_adapter_relies_on(tmp_path, tokenizer):
    """Fails when a TRL upgrade renames a hooked method, changes its parameters, or drops
    a batch key or trainer attribute the adapter reads."""
    assert check_trl_internals() == []

    class Renamed:
        def _compute_loss(self, model, batch): ...

    problems = check_trl_internals(Renamed)
    assert any("_compute_loss no longer accepts ['inputs']" in p for p in problems)
    assert any("_get_per_token_logps_and_entropies is missing" in p for p in problems)

    trainer = build(trl.GRPOTrainer, make_args(tmp_path), tokenizer)
    assert all(hasattr(trainer, a) for a in REQUIRED_TRAINER_ATTRIBUTES)
    batch = rollout_batch(trainer)
    assert set(batch) >= REQUIRED_INPUT_KEYS
    assert batch["advantages"].shape == (batch["completion_ids"].shape[0],)

    # A batch without a key the adapter reads fails loudly, naming the key.
    adapter = build(DivRLGRPOTrainer, make_args(tmp_path, lp_reg=True), tokenizer)
    broken = {k: v for k, v in rollout_batch(adapter).items() if k != "advantages"}
    with pytest.raises(RuntimeError, match="advantages"):
        adapter.compute_loss(adapter.model, broken)


# ----------------------------------------------------------------------------- equivalence


def test_eta_zero_and_lp_reg_off_equals_plain_grpo(tmp_path, tokenizer, store):
    args = dict(gradient_accumulation_steps=2, per_device_train_batch_size=4)
    plain = build(trl.GRPOTrainer, make_args(tmp_path, **args), tokenizer)
    adapter = build(
        DivRLGRPOTrainer,
        make_args(
            tmp_path, divergence="js", reference_store=str(store), divergence_coef=0.0, **args
        ),
        tokenizer,
        model=tiny_model(0),  # a fresh copy: TRL patches the forward of the model it gets
    )
    batch = rollout_batch(plain)
    plain_loss, plain_grads = loss_and_grads(plain, batch)
    loss, grads = loss_and_grads(adapter, batch)
    assert loss == pytest.approx(plain_loss, abs=1e-7)
    for g, h in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(g, h, rtol=0, atol=1e-7)
    assert plain_loss != 0.0 and any(g.abs().sum() > 0 for g in plain_grads)
    # the divergence was computed (and logged) although it had no weight
    assert adapter._metrics["train"]["divrl/dph/divergence"]


@pytest.mark.parametrize(
    ("kind", "weighting"), [("js", "paper"), ("forward_kl", "paper"), ("js", "authors")]
)
def test_dph_term_is_eta_times_divergence_over_grad_accum(
    tmp_path, tokenizer, foreign_store, kind, weighting
):
    """Loss and gradient added by DPH = eta / GA * D_f on the seeded reference draw, with
    D_f recomputed here sample by sample on unpadded sequences; under the `authors`
    weighting eta is further multiplied by the reference samples' share of the samples
    (reference samples per micro-batch / completions in it)."""
    eta, ga, per_step = 0.5, 2, 3
    common = dict(
        divergence=kind,
        reference_store=str(foreign_store),
        reference_batch_size=per_step,
        divergence_weighting=weighting,
        gradient_accumulation_steps=ga,
    )
    base = build(DivRLGRPOTrainer, make_args(tmp_path, divergence_coef=0.0, **common), tokenizer)
    model = tiny_model(0)  # same weights as base's (seeded); TRL patches each model's forward
    with_dph = build(
        DivRLGRPOTrainer, make_args(tmp_path, divergence_coef=eta, **common), tokenizer, model=model
    )
    batch = rollout_batch(base)
    loss0, grads0 = loss_and_grads(base, batch)
    loss1, grads1 = loss_and_grads(with_dph, batch)
    if weighting == "authors":
        assert batch["completion_ids"].shape[0] == 8  # 2 prompts x 4 generations
        eta = eta * per_step / 8

    samples = ReferenceStore(foreign_store).samples
    drawn = [samples[i] for i in EpochSampler(len(samples), seed=0).take(per_step)]
    model.zero_grad()
    model.eval()  # HF skips gradient checkpointing (on in TRL's config) in eval mode
    lps, refs = [], []
    for s in drawn:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1]
        lps.append(token_log_probs(logits, torch.tensor(s.response_ids)))
        refs.append(torch.tensor(s.ref_log_probs))
    width = max(len(x) for x in lps)
    pad = lambda xs: torch.stack([torch.nn.functional.pad(x, (0, width - len(x))) for x in xs])  # noqa: E731
    mask = pad([torch.ones(len(x)) for x in lps])
    divergence, _ = reference_divergence_loss(pad(lps), pad(refs), mask, kind)
    (eta / ga * divergence).backward()
    expected = [p.grad.clone() for p in model.parameters()]

    divergence = divergence.detach()
    assert float(divergence) > 1e-3  # u != 1: the foreign store's log-probs
    assert loss1 - loss0 == pytest.approx(eta / ga * float(divergence), rel=1e-4)
    for g1, g0, e in zip(grads1, grads0, expected, strict=True):
        torch.testing.assert_close(g1 - g0, e, rtol=1e-4, atol=1e-6)
    assert with_dph._metrics["train"]["divrl/dph/divergence"][-1] == pytest.approx(
        float(divergence), rel=1e-5
    )


@pytest.mark.parametrize("loss_type", ["bnpo", "grpo", "dapo", "dr_grpo"])
def test_lp_reg_loss_equals_divrl_lp_reg_loss(tmp_path, tokenizer, loss_type):
    """On-policy: TRL's loss with the adapter = divrl's lp_reg_loss computed from a plain
    logits forward (proxy from the same policy, r = 1) and reduced as TRL reduces
    ``loss_type`` (with 2 gradient-accumulation steps), value and gradient."""
    ga, horizon = 2, 6
    # divrl aggregation and the factor that turns it into TRL's reduction of the whole batch
    agg, factor = {
        "bnpo": ("token-mean", 1 / ga),
        "grpo": ("seq-mean-token-mean", 1 / ga),
        # dapo divides by the generation batch's token count, which already spans the GA steps
        "dapo": ("token-mean", 1.0),
        "dr_grpo": ("seq-mean-token-sum", 1 / (ga * horizon)),
    }[loss_type]
    lp_args = dict(loss_options=dict(rho=0.5, kappa=0.02, beta=1.0))
    args = make_args(
        tmp_path,
        lp_reg=True,
        loss_type=loss_type,
        epsilon=1.0,
        epsilon_high=9.0,
        gradient_accumulation_steps=ga,
        max_completion_length=horizon,
        **lp_args,
    )
    trainer = build(DivRLGRPOTrainer, args, tokenizer)
    batch = rollout_batch(trainer, seed=3)
    loss, grads = loss_and_grads(trainer, batch)

    lp, proxy, log_z = full_forward(trainer.model, batch)
    expected, metrics = lp_reg_loss(
        lp,
        lp.detach(),
        proxy,
        batch["advantages"],
        batch["completion_mask"],
        rho=0.5,
        beta=1.0,
        clip_low=1.0,
        clip_high=9.0,
        agg=agg,
        log_normalizer=log_z,
    )
    expected = expected * factor
    assert metrics["lp_reg/num_regularized"] > 0  # the replacement really happened
    assert loss == pytest.approx(float(expected), abs=1e-6)
    trainer.model.zero_grad()
    expected.backward()
    for g, p in zip(grads, trainer.model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)
    logged = trainer._metrics["train"]
    assert logged["divrl/lp_reg/num_regularized"][-1] == metrics["lp_reg/num_regularized"]
    assert logged["divrl/lp_reg/mean_z"][-1] == pytest.approx(metrics["lp_reg/mean_z"], rel=1e-5)


def test_lp_reg_off_policy_proxy_comes_from_the_old_log_prob_forward(tmp_path, tokenizer):
    # num_iterations=2: TRL computes old log-probs at rollout time; the proxy comes with them
    args = make_args(tmp_path, lp_reg=True, loss_options={"rho": 0.5}, num_iterations=2)
    trainer = build(DivRLGRPOTrainer, args, tokenizer)
    batch = rollout_batch(trainer)
    assert "old_per_token_logps" in batch and PROXY_KEY in batch and LOG_Z_KEY in batch
    with torch.no_grad():
        _, proxy, log_z = full_forward(trainer.model, batch)
    valid = batch["completion_mask"].bool()
    torch.testing.assert_close(batch[PROXY_KEY][valid], proxy[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batch[LOG_Z_KEY][valid], log_z[valid], rtol=1e-5, atol=1e-5)
    # after an update the loss uses the frozen old proxy and old log-probs (r != 1)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    loss = trainer.compute_loss(trainer.model, batch)
    lp, current_proxy, _ = full_forward(trainer.model, batch)
    expected, metrics = lp_reg_loss(
        lp,
        batch["old_per_token_logps"],
        batch[PROXY_KEY],
        batch["advantages"],
        batch["completion_mask"],
        rho=0.5,
        clip_low=0.2,  # TRL's default epsilon, the clip range of the unselected tokens
        clip_high=0.2,
        agg="token-mean",  # TRL's default loss_type dapo, one process, no accumulation
    )
    assert metrics["lp_reg/num_regularized"] > 0
    assert not torch.allclose(current_proxy[valid], proxy[valid])
    assert float(loss) == pytest.approx(float(expected), abs=1e-6)


def test_lp_reg_proxy_matches_trl_log_probs_under_bf16_autocast(tmp_path, tokenizer):
    """The proxy's LM-head projection runs under TRL's autocast: where the min-p filter keeps
    every token (Z = 1) the proxy log-prob is TRL's own log-prob."""
    args = make_args(
        tmp_path, bf16=True, lp_reg=True, loss_options={"kappa": 0.0}, num_iterations=2
    )
    trainer = build(DivRLGRPOTrainer, args, tokenizer)
    batch = rollout_batch(trainer)
    valid = batch["completion_mask"].bool()
    assert torch.all(batch[LOG_Z_KEY][valid] == 0.0)  # kappa = 0 keeps every token
    torch.testing.assert_close(
        batch[PROXY_KEY][valid], batch["old_per_token_logps"][valid].float(), rtol=0, atol=1e-5
    )


# ----------------------------------------------------------------------------- training


def params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    ("mode", "overrides"),
    [
        ("dph_js", dict(divergence="js", divergence_coef=0.2, reference_batch_size=2)),
        ("dph_f", dict(divergence="forward_kl", divergence_coef=0.05, reference_batch_size=2)),
        ("lp_reg", dict(lp_reg=True, loss_options={"rho": 0.5}, epsilon=1.0, epsilon_high=9.0)),
    ],
)
def test_training_steps_change_parameters_and_log_divrl_metrics(
    tmp_path, tokenizer, store, mode, overrides
):
    if mode.startswith("dph"):
        overrides = {**overrides, "reference_store": str(store)}
    args = make_args(tmp_path, max_steps=3, gradient_accumulation_steps=2, **overrides)
    trainer = DivRLGRPOTrainer(
        model=tiny_model(0),
        reward_funcs=[varied_reward, count_ones_reward],
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tokenizer,
    )
    before = params(trainer.model)
    trainer.train()
    after = params(trainer.model)
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 3
    prefix = "divrl/dph/" if mode.startswith("dph") else "divrl/lp_reg/"
    for h in steps:
        assert any(k.startswith(prefix) for k in h), h
    if mode.startswith("dph"):
        # The store holds the initial policy's log-probs: at step 1, u = 1 on every token,
        # which also checks that the reference samples' positions line up.
        assert steps[0]["divrl/dph/u_mean"] == pytest.approx(1.0, abs=1e-5)
        assert steps[0]["divrl/dph/divergence"] == pytest.approx(0.0, abs=1e-6)
        assert steps[-1]["divrl/dph/divergence"] > 0.0
    else:
        assert sum(h["divrl/lp_reg/num_selected"] for h in steps) > 0
        assert all(0.0 < h["divrl/lp_reg/mean_z"] <= 1.0 for h in steps)


# ----------------------------------------------------------------------------- distributed

WORKER = Path(__file__).with_name("dist_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_torchrun_gloo(tmp_path, store, run_in_session):
    out = tmp_path / "dist"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DIVRL_TEST_STORE": str(store)}
    env["PYTHONPATH"] = os.pathsep.join([str(WORKER.parent), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        str(WORKER),
        str(out),
    ]
    proc = run_in_session(cmd, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0]["world"] == results[1]["world"] == 2
    # the script does not call trainer.end(): the trainer did at exit, dropping the DDP
    # wrapper before the group (else a rank can hang at exit)
    ended = [json.loads((out / f"rank{r}.end.json").read_text()) for r in range(2)]
    assert all(r["wrapped_in_ddp"] for r in results)
    assert all(not e["ddp_alive_after_end"] and not e["group_alive"] for e in ended)
    # DDP kept the replicas identical, and the reference draws differed between ranks
    assert results[0]["param_sum"] == pytest.approx(results[1]["param_sum"], rel=1e-6)
    assert results[0]["param_sum"] != pytest.approx(results[0]["initial_param_sum"], rel=1e-9)
    assert results[0]["first_reference"] != results[1]["first_reference"]
    steps = [h for h in results[0]["log_history"] if "loss" in h]
    assert len(steps) == 2
    assert all("divrl/dph/divergence" in h and "divrl/lp_reg/num_selected" in h for h in steps)


def test_integrations_package_does_not_import_trl():
    code = "import sys, divrl.integrations; sys.exit('trl' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_reference_draws_cycle_split_by_rank_and_resume(store):
    cpu = torch.device("cpu")

    def stream():
        return integration.ReferenceStream(str(store), 1.0, seed=5, pad_token_id=0)

    n = len(ReferenceStore(store))
    # two processes, 2 samples each per micro-batch, 4 micro-batches: 16 draws over a 6-sample store
    ranks = [stream(), stream()]
    batches = [[ranks[r].next_batch(2, r, 2, cpu) for r in range(2)] for _ in range(4)]
    order = [tuple(row) for step in batches for b in step for row in b.input_ids.tolist()]
    assert len(set(order[:n])) == n  # a pass visits every sample once, across the ranks
    # a run resumed after 2 micro-batches draws what the uninterrupted run drew next
    resumed = stream()
    resumed.seek(2 * 2 * 2)
    again = resumed.next_batch(2, 1, 2, cpu)
    assert torch.equal(again.input_ids, batches[2][1].input_ids)
    assert torch.equal(again.ref_log_probs, batches[2][1].ref_log_probs)


def test_lp_reg_refuses_a_sharded_lm_head():
    """Under FSDP1 the head's weight read outside the forward is a flattened shard: a clear
    error, not a wrong proxy (the FSDP2 DTensor case runs in tests/training/
    fsdp_train_worker.py); FSDP2 and ZeRO-1/2/3 are taken (test_trl_zero3.py)."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from divrl.integrations.trl_lp_reg import full_lm_head, refuse_sharded_training

    lm = tiny_model()
    assert full_lm_head(lm) is lm.get_output_embeddings()
    fsdp1 = SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=SimpleNamespace(fsdp_version=1))
    with pytest.raises(ValueError, match="sharded"):
        refuse_sharded_training(SimpleNamespace(distributed_type=DistributedType.FSDP, state=fsdp1))
    fsdp2 = SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=SimpleNamespace(fsdp_version=2))
    refuse_sharded_training(SimpleNamespace(distributed_type=DistributedType.FSDP, state=fsdp2))
    for stage in (2, 3):
        zero = SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=stage))
        refuse_sharded_training(
            SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, state=zero)
        )
    # an FSDP1-style flattened / resharded view: fewer rows than the vocabulary
    head = lm.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach()[:3].clone())
    with pytest.raises(ValueError, match="sharded"):
        full_lm_head(lm)


def test_lp_reg_logs_the_regularised_tokens_z_advantage_and_net_push(tmp_path, tokenizer):
    """Off-policy (frozen proxy, r != 1): the logged regime diagnostics equal a hand
    computation, token by token, over the tokens the loss regularised."""
    options = {"rho": 1.0, "kappa": 0.5, "beta": 0.5, "min_k": 1}  # many, of both signs
    args = make_args(tmp_path, lp_reg=True, loss_options=options, num_iterations=2)
    trainer = build(DivRLGRPOTrainer, args, tokenizer)
    batch = rollout_batch(trainer)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    trainer.compute_loss(trainer.model, batch)
    with torch.no_grad():
        lp, _, _ = full_forward(trainer.model, batch)
    old, proxy, adv = batch["old_per_token_logps"], batch[PROXY_KEY], batch["advantages"]
    mask = batch["completion_mask"]
    reg = lp_reg_selection(lp, proxy, adv, mask, 1.0, 1).regularized
    nets, zs = [], []
    for i, j in reg.nonzero().tolist():
        d = float(proxy[i, j] - lp[i, j])
        r = math.exp(float(lp[i, j] - old[i, j]))
        nets.append(float(adv[i]) * r + 0.5 * (math.expm1(d) if math.expm1(d) - d < 10 else 0))
        zs.append(math.exp(float(batch[LOG_Z_KEY][i, j])))
    ups = sum(n > 0 for n in nets)
    assert 0 < ups < len(nets)
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert logged["divrl/lp_reg/num_net_up"] == ups
    assert logged["divrl/lp_reg/net_up_share"] == pytest.approx(ups / len(nets))
    assert logged["divrl/lp_reg/net_push_mean"] == pytest.approx(
        sum(nets) / len(nets), rel=1e-4, abs=1e-6
    )
    assert logged["divrl/lp_reg/reg_z_mean"] == pytest.approx(sum(zs) / len(zs), rel=1e-5)
    assert logged["divrl/lp_reg/reg_abs_adv_mean"] == pytest.approx(
        sum(abs(float(adv[i])) for i, _ in reg.nonzero().tolist()) / len(nets), rel=1e-5
    )
