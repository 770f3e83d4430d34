"""Worker of the DeepSpeed ZeRO-3 Lp-Reg tests: `torchrun --nproc_per_node 2 zero3_worker.py MODE OUT`.

``proxy`` (``proxy-tied``: the head tied to the input embeddings): the adapter's Lp-Reg
proxy (the hook on the backbone, each chunk projected through the LM head) on a tiny Llama
before and after ``deepspeed.initialize`` with ZeRO-3 (every parameter partitioned, the
head a placeholder between forwards), over three forward/backward/step rounds (the first
records ZeRO-3's module trace, the later ones follow it); also the same hidden states
projected after the forward, where the head is a placeholder, and the head's ZeRO-3 status
in the hook and after it. ``zero1`` / ``zero2`` / ``zero3`` / ``ddp``: two ``train()``
steps of the TRL adapter with Lp-Reg and DPH-JS (the reference store at
``$DIVRL_TEST_STORE``) under that DeepSpeed ZeRO stage (``TrainingArguments.deepspeed``)
or DDP, gloo, CPU: the logged steps, the parameters' sum and, per policy forward, the
largest gap between the proxy's plain log-probs and TRL's. Each rank writes
``OUT/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from trl_helpers import make_args, prompt_dataset, tiny_model, tiny_tokenizer, varied_reward  # noqa: E402

from divrl.integrations.trl_lp_reg import hidden_state_hook, lm_head_projection, proxy_from_hidden  # noqa: E402

# Every parameter partitioned, however small (DeepSpeed keeps parameters under 1e5
# elements whole by default: all of the tiny model's), fp32, no offload.
ZERO3 = {
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "bf16": {"enabled": False},
    "fp16": {"enabled": False},
}


def proxies(model, ids: torch.Tensor, keep: int, forward=None, seen=None) -> list[list[float]]:
    """The proxies of the hook on ``model``'s backbone in a forward (``forward``: the module
    run, ``model`` by default); ``seen``: receives each chunk's hidden states and the head
    weight's ZeRO-3 status in the hook."""
    parts: list[torch.Tensor] = []

    def project(hidden: torch.Tensor) -> None:
        if seen is not None:
            seen.append((hidden, str(model.lm_head.weight.ds_status)))
        with lm_head_projection(model) as head:
            parts.append(proxy_from_hidden(head, hidden, ids[:, -keep:], 0.02, 1.0)[0])

    with torch.no_grad(), hidden_state_hook(model.model, keep, project):
        (forward or model)(input_ids=ids)
    return torch.cat(parts).tolist()


def model_with_head(tied: bool):
    """``tiny_model(0)``; ``tied``: its LM head the input embeddings' weight (as in small
    Qwen and Llama models), so ZeRO-3 gathers it for the embedding too."""
    model = tiny_model(0)
    if tied:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def proxy_case(out: Path, tied: bool) -> dict:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    model = model_with_head(tied)
    ids = torch.randint(3, 16, (3, 10), generator=torch.Generator().manual_seed(rank))
    config = {**ZERO3, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    head = engine.module.lm_head.weight
    result = {"partitioned": hasattr(head, "ds_id") and head.numel() == 0, "rounds": []}
    result["tied"] = head is engine.module.model.embed_tokens.weight
    for _ in range(3):  # the first forward records ZeRO-3's trace, the later ones follow it
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            plain = model_with_head(tied)  # the same weights, unsharded
            plain.load_state_dict({k: v.clone() for k, v in engine.module.state_dict().items()})
        before = proxies(plain, ids, 6)
        seen: list = []
        after = proxies(engine.module, ids, 6, forward=engine, seen=seen)
        # the same hidden states projected outside any forward: the head a placeholder there
        outside_status = str(head.ds_status)
        with torch.no_grad(), lm_head_projection(engine.module) as project:
            outside = [proxy_from_hidden(project, h, ids[:, -6:], 0.02, 1.0)[0] for h, _ in seen]
        result["rounds"].append(
            {
                "before": before,
                "after": after,
                "outside": torch.cat(outside).tolist(),
                "statuses": [status for _, status in seen] + [outside_status],
            }
        )
        result["placeholder_after"] = head.numel() == 0
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    return result


def zero_config(stage: int) -> dict:
    """fp32 DeepSpeed ZeRO ``stage`` (1 and 2 partition the optimizer state, 2 the gradients
    too, 3 also every parameter: :data:`ZERO3`)."""
    if stage == 3:
        return ZERO3
    return {**ZERO3, "zero_optimization": {"stage": stage}}


def optimizer_share(engine, params: list[torch.Tensor]) -> float | None:
    """The share of the parameters whose fp32 optimizer copy this rank holds under ZeRO-1/2
    (about 1 / world: the optimizer state is partitioned); None under ZeRO-3."""
    groups = getattr(engine.optimizer, "single_partition_of_fp32_groups", None)
    if groups is None:
        return None
    return sum(g.numel() for g in groups) / sum(p.numel() for p in params)


def train_case(out: Path, stage: int | None) -> dict:
    """Two ``train()`` steps with Lp-Reg and DPH-JS under DeepSpeed ZeRO ``stage``, or DDP
    (``None``)."""
    from divrl.integrations import trl as integration

    gaps: list[float] = []
    capture = integration.DivRLGRPOTrainer._capture_proxy

    def recording(self, cap, logps, parts, attention_mask, logits_to_keep):
        check = torch.cat([p[2] for p in parts])
        mask = attention_mask[:, -logits_to_keep:].bool()
        gaps.append(float((check - logps.detach().float()).abs()[mask].max()))
        return capture(self, cap, logps, parts, attention_mask, logits_to_keep)

    integration.DivRLGRPOTrainer._capture_proxy = recording
    # "auto": the Trainer fills these in from the training arguments
    sizes = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    zero = stage is not None
    backend: dict = {"ddp_backend": "gloo"}
    if zero:
        config = {**zero_config(stage), **dict.fromkeys(sizes, "auto")}
        backend = {"deepspeed": config, "use_cpu": False}
        # accelerate takes a machine without an accelerator for one process unless a backend
        # is named, and the Trainer names none under DeepSpeed: the state is set up here,
        # with gloo, and the Trainer told to use it (on GPUs accelerate picks nccl itself).
        from accelerate import PartialState

        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        PartialState(backend="gloo")
        backend["accelerator_config"] = {"use_configured_state": True}
    dph = {"divergence": "js", "divergence_coef": 0.2}
    dph["reference_store"] = os.environ["DIVRL_TEST_STORE"]
    args = make_args(out, lp_reg=True, loss_options={"rho": 0.5}, **dph, **backend)
    trainer = integration.DivRLGRPOTrainer(
        model=tiny_model(0),
        reward_funcs=varied_reward,
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tiny_tokenizer(),
    )
    trainer.train()
    model = trainer.model_wrapped.module if zero else trainer.model
    head = model.get_output_embeddings().weight
    params = list(model.parameters())
    if stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            param_sum = float(sum(p.detach().double().sum() for p in params))
    else:
        param_sum = float(sum(p.detach().double().sum() for p in params))
    return {
        "distributed_type": trainer.accelerator.distributed_type.value,
        "world": trainer.accelerator.num_processes,
        "zero_stage": trainer.model_wrapped.zero_optimization_stage() if zero else None,
        # DeepSpeedZeroOptimizer (stages 1 and 2) or DeepSpeedZeroOptimizer_Stage3
        "optimizer": type(getattr(trainer.model_wrapped, "optimizer", None)).__name__,
        "optimizer_share": optimizer_share(trainer.model_wrapped, params) if zero else None,
        "partitioned": hasattr(head, "ds_id") and head.numel() == 0,
        "gaps": gaps,
        "param_sum": param_sum,
        "steps": [h for h in trainer.state.log_history if "loss" in h],
    }


def main(mode: str, out: Path) -> None:
    if mode.startswith("proxy"):
        result = proxy_case(out, tied=mode == "proxy-tied")
    else:
        result = train_case(out, stage=int(mode[4:]) if mode.startswith("zero") else None)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
