"""The verl plugin's loss step against verl's own ``ppo_loss`` on the same batch (CPU).

Run in the verl extra's environment (``make test-verl`` builds it):

    OMP_NUM_THREADS=1 .venv-verl/bin/python -m benchmarks.verl_overhead

One step = a tiny Llama's forward on the batch, the engine's log-probs from the logits
(verl's ``logprobs_from_logits``), the loss (verl's ``ppo_loss``, or divrl's
:class:`DivRLLoss` for GRPO, DPH-JS on a batch with rehearsal rows, and Lp-Reg with the
proxy from the same logits through the logits-processor call), and the backward. Each
variant's median step time is divided by verl's ``ppo_loss`` on the same rows.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from verl.utils.torch_functional import logprobs_from_logits
from verl.workers.utils.losses import ppo_loss

from benchmarks.common import spread, summary, timed
from divrl.data.reference_store import ReferenceSample
from divrl.integrations.verl.losses import DivRLLoss
from divrl.integrations.verl.rehearsal import join_rehearsal
from divrl.integrations.verl.settings import DivRLVerlSettings


def packed_rows(n: int, prompt: int, response: int, vocab: int, seed: int):
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        # lengths differ by a few tokens, as rollouts do, so verl's layout is nested (jagged)
        p = torch.randint(0, vocab, (prompt - i % 3,), generator=g)
        r = torch.randint(0, vocab, (response - i % 5,), generator=g)
        prompt_len, response_len = len(p), len(r)
        rows.append(
            {
                "prompts": p,
                "responses": r,
                "input_ids": torch.cat([p, r]),
                "attention_mask": torch.ones(prompt_len + response_len, dtype=torch.int64),
                "position_ids": torch.arange(prompt_len + response_len),
                "response_mask": torch.ones(response_len, dtype=torch.int64),
                "loss_mask": torch.ones(response_len, dtype=torch.int64),
                "old_log_probs": -torch.rand(response_len, generator=g) * 8,
                "advantages": torch.full((response_len,), float(torch.randn(1, generator=g))),
            }
        )
    return tu.list_of_dict_to_tensordict(rows)


def actor_config():
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(
        OmegaConf.create(
            {
                "_target_": "verl.workers.config.FSDPActorConfig",
                "strategy": "fsdp2",
                "ppo_mini_batch_size": 4,
                "ppo_micro_batch_size_per_gpu": 4,
                "rollout_n": 1,
                "clip_ratio_low": 0.2,
                "clip_ratio_high": 0.28,
                "loss_agg_mode": "token-mean",
            }
        )
    )


def _step(model, batch, loss_fn, logits_hook: bool) -> None:
    from verl.utils import tensordict_utils as tu

    tu.assign_non_tensor(
        batch, dp_size=1, batch_num_tokens=None, global_batch_size=None, sp_size=1, temperature=1.0
    )
    ids = batch["input_ids"]
    lengths = ids.offsets().diff().tolist()
    padded = torch.nested.to_padded_tensor(ids, 0)
    mask = (torch.arange(padded.shape[1])[None] < torch.tensor(lengths)[:, None]).long()
    logits = model(input_ids=padded, attention_mask=mask).logits
    rmpad = torch.cat([logits[i, :n] for i, n in enumerate(lengths)])
    labels = torch.roll(ids.values(), -1)
    out = {}
    if logits_hook:
        extra = loss_fn(student_logits=rmpad.unsqueeze(0), data=batch)
        out.update(
            {
                k: torch.nested.nested_tensor_from_jagged(v.squeeze(0), ids.offsets())
                for k, v in extra.items()
            }
        )
    log_probs = logprobs_from_logits(rmpad, labels, inplace_backward=False)
    out["log_probs"] = torch.nested.nested_tensor_from_jagged(log_probs, ids.offsets())
    loss, _ = loss_fn(model_output=out, data=batch)
    loss.backward()
    model.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--response", type=int, default=192)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    model = LlamaForCausalLM(cfg)
    config = actor_config()
    rollouts = packed_rows(args.rows, args.prompt, args.response, args.vocab, seed=1)
    refs = packed_rows(args.rows // 4 or 1, args.prompt, args.response, args.vocab, seed=2)
    samples = [
        ReferenceSample(
            f"q{i}",
            refs[i]["prompts"].tolist(),
            refs[i]["responses"].tolist(),
            refs[i]["old_log_probs"].tolist(),
        )
        for i in range(len(refs))
    ]
    joined, _ = join_rehearsal(rollouts, samples)
    dph = DivRLVerlSettings(
        divergence="js",
        divergence_coef=0.2,
        divergence_weighting="paper",
        reference_store="unused",
        reference_per_step=len(samples),
    )
    variants = {
        "grpo": (rollouts, DivRLLoss(config, DivRLVerlSettings()), False),
        "dph_js": (joined, DivRLLoss(config, dph), False),
        "lp_reg": (rollouts, DivRLLoss(config, DivRLVerlSettings(policy_loss="lp_reg")), True),
    }
    vanilla = partial(ppo_loss, config=config)
    results = {}
    for name, (batch, loss_fn, hook) in variants.items():
        for _ in range(2):  # warm-up of both
            _step(model, batch, vanilla, False)
            _step(model, batch, loss_fn, hook)
        # interleaved, alternating which goes first: a shared machine's load hits both alike
        base, ours = [], []
        for r in range(args.repeats):
            pair = [(base, vanilla, False), (ours, loss_fn, hook)]
            for out, fn, h in pair if r % 2 == 0 else pair[::-1]:
                out.append(timed(lambda b=batch, f=fn, h=h: _step(model, b, f, h), 1, warmup=0)[0])
        ratio = summary(ours)["median"] / summary(base)["median"]
        # the fastest of each: the least disturbed by other load on a shared machine
        best = min(ours) / min(base)
        results[name] = {
            "verl_ppo_loss_s": summary(base),
            "divrl_s": summary(ours),
            "ratio": ratio,
            "ratio_of_minima": best,
        }
        print(
            f"{name:8s} verl {spread(summary(base))} s  divrl {spread(summary(ours))} s  "
            f"ratio {ratio:.3f} (of minima {best:.3f})"
        )
    print(json.dumps({"args": vars(args), "results": results}, indent=1))
    return results


if __name__ == "__main__":
    main()
