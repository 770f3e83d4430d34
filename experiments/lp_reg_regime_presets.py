"""Where the toy worlds' Lp-Reg presets sit on the regime map (docs/results/lp_reg_regime.md).

Trains a preset for a few steps exactly as configured (its selection scope, batch, loss)
and records, for every token its loss regularised, ``Z`` (the min-p kept mass at its
position), ``|A|`` and the net push on its log-prob (:func:`divrl.algorithms.lp_reg_net_push`,
from the very inputs of each loss call). Prints their quantiles and the share pushed up,
per preset, for all steps and for the first and last half.

Usage (from the repository root; minutes per preset on the CPU)::

    python -m experiments.lp_reg_regime_presets --steps 10 --out presets.json \\
        sql=configs/toy/lp_reg.yaml countdown=configs/toy/countdown/lp_reg.yaml \\
        sparks=configs/toy/sparks/lp_reg.yaml
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import torch

from divrl.fileio import atomic_write_text


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    t = torch.tensor(values, dtype=torch.float64)
    qs = torch.quantile(t, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
    return {"n": len(values), "mean": float(t.mean()), "q10": qs[0], "q50": qs[1], "q90": qs[2]}


def summary(tokens: list[tuple[float, float, float]]) -> dict:
    z, a, net = (list(x) for x in zip(*tokens, strict=True)) if tokens else ([], [], [])
    return {
        "z": _quantiles(z),
        "abs_adv": _quantiles(a),
        "net_push": _quantiles(net),
        "net_up_share": sum(n > 0 for n in net) / len(net) if net else None,
    }


def place(config_path: str, steps: int, overrides: list[str]) -> dict:
    """Train ``steps`` steps of the preset and collect its regularised tokens, per step."""
    from divrl.algorithms import lp_reg_net_push, lp_reg_selection
    from divrl.commands.train import with_toy_defaults
    from divrl.training.config import load_config
    from divrl.training.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            config_path,
            [f"train.total_steps={steps}", f"logging.output_dir={tmp}/run", *overrides],
        )
        trainer = Trainer(with_toy_defaults(cfg))
        spec = trainer.update.loss_spec
        per_call: list[list[tuple[float, float, float]]] = []

        def spy(**kw):
            loss, metrics = spec.fn(**kw)
            args = (kw["log_prob"], kw["proxy_log_prob"], kw["advantages"], kw["mask"])
            reg = lp_reg_selection(*args, kw["rho"], kw["min_k"], kw.get("selected")).regularized
            z, a, net = lp_reg_net_push(
                kw["log_prob"], kw["old_log_prob"], kw["proxy_log_prob"], kw["advantages"],
                reg, kw["beta"], kw.get("log_normalizer"),
            )  # fmt: skip
            per_call.append(list(zip(z.tolist(), a.tolist(), net.tolist(), strict=True)))
            return loss, metrics

        trainer.update.loss_spec = dataclasses.replace(spec, fn=spy)
        history = trainer.train()
    # split the loss calls into steps by the step's logged count of regularised tokens
    counts = [int(h.get("lp_reg/num_regularized", 0)) for h in history]
    flat = [t for call in per_call for t in call]
    per_step, at = [], 0
    for c in counts:
        per_step.append(flat[at : at + c])
        at += c
    half = len(per_step) // 2
    return {
        "config": config_path,
        "steps": steps,
        "overrides": overrides,
        "regularized_per_step": counts,
        "pass_rate_per_step": [h.get("reward/score") for h in history],
        "all": summary(flat),
        "first_half": summary([t for s in per_step[:half] for t in s]),
        "last_half": summary([t for s in per_step[half:] for t in s]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.lp_reg_regime_presets")
    ap.add_argument("presets", nargs="+", help="NAME=CONFIG of each Lp-Reg preset")
    ap.add_argument("--steps", type=int, default=10, help="training steps per preset")
    ap.add_argument("--out", type=Path, required=True, help="JSON of the placements")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every preset")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    done = json.loads(args.out.read_text()) if args.out.exists() else {}
    for item in args.presets:
        name, _, path = item.partition("=")
        if name in done:  # resumable: a preset already placed is kept
            continue
        done[name] = place(path, args.steps, args.set)
        atomic_write_text(args.out, json.dumps(done, indent=1) + "\n")
        s = done[name]["all"]
        print(name, json.dumps({k: s[k] for k in ("z", "abs_adv", "net_up_share")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
