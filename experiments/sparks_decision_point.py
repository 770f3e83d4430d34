"""The next-token distribution of a sparks-world model at its decision point.

For ``--problems`` easy and as many hard problems (drawn with ``--seed``), the model reads
the prompt and the habit's right first answer (``... : ... = 8``) and one forward pass
gives, averaged: p(spark), p(end), the closers' mass and the largest closer, how many of
the 29 closers Lp-Reg's min-p filter keeps (p >= kappa p_max), the kept mass Z and the
on-policy push on a regularised token, 1/Z - 1.

Usage (from the repository root; seconds)::

    .venv/bin/python -m experiments.sparks_decision_point [MODEL_DIR] [--kappa 0.02]
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch

from divrl.rewards.sparks_reward import CLOSERS, SPARK_MARK
from divrl.toy import sparks
from divrl.toy.sparks_world import PRETRAINED_DIR


@torch.no_grad()
def decision_point(model_dir, problems: int = 64, seed: int = 5, kappa: float = 0.02):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg, rng = sparks.SparksConfig(), random.Random(seed)
    closers = [tok.convert_tokens_to_ids(c) for c in CLOSERS]
    spark = tok.convert_tokens_to_ids(SPARK_MARK)
    out = {}
    for hard in (False, True):
        rows = []
        for _ in range(problems):
            p = sparks.sample_problem(rng, cfg, hard=hard)
            g = p.numbers[: cfg.glance]
            ids = tok(sparks.prompt_text(p) + "\nA: ")["input_ids"]
            ids += tok(f"{sparks.read_back(g)} = {max(g)}")["input_ids"]
            pr = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
            keep = pr >= kappa * pr.max()
            z = pr[keep].sum().item()
            rows.append(
                (
                    pr[spark].item(),
                    pr[tok.eos_token_id].item(),
                    pr[closers].sum().item(),
                    pr[closers].max().item(),
                    keep[closers].sum().item(),
                    z,
                    1 / z - 1,
                )
            )
        keys = ("spark", "end", "closers", "largest_closer", "closers_kept", "z", "push")
        out["hard" if hard else "easy"] = dict(zip(keys, np.mean(rows, 0).tolist(), strict=True))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.sparks_decision_point")
    p.add_argument("model", nargs="?", default=str(PRETRAINED_DIR))
    p.add_argument("--problems", type=int, default=64)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--kappa", type=float, default=0.02)
    args = p.parse_args(argv)
    for group, v in decision_point(args.model, args.problems, args.seed, args.kappa).items():
        print(group, " ".join(f"{k} {x:.4f}" for k, x in v.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
