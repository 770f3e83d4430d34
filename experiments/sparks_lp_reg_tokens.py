"""Which tokens Lp-Reg selects and regularises on the sparks world, by their role.

For a model (the preset's base model, or a checkpoint with ``--model``) it draws
``--batches`` rollout batches exactly as training steps 1, 2, ... would (the trainer's own
experience stage), cuts each into the preset's selection populations (consecutive
``algorithm.lp_reg_group_size`` rows, one micro-batch each: what
``configs/toy/sparks/lp_reg.yaml`` selects in when a virtual GPU's rows fit its token
budget) and applies Lp-Reg's selection (:func:`divrl.algorithms.lp_reg_selection`, the
loss's own), then counts tokens by role: ``spark`` (`` wait ``), ``closer``, ``end`` (the
eos), ``answer`` (a digit after `` = ``), ``read-back`` / ``scratchpad`` digits and
``other``; per population, ``k`` and the negative-advantage tokens.

Usage (from the repository root; a minute per batch on a loaded CPU)::

    .venv/bin/python -m experiments.sparks_lp_reg_tokens --batches 4 --out base.json
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from typing import Any

import torch

from divrl.rewards.sparks_reward import CHECK_EQUALS, CLOSERS, SCRATCH, SPARK_MARK
from experiments.records import write_result

ROLES = ("spark", "closer", "end", "answer", "read-back", "scratchpad", "other")
COUNTS = ("tokens", "candidates", "selected", "regularized")


def token_roles(pieces: list[str], eos: str) -> list[str]:
    """The role of each token of a sparks response (token strings)."""
    roles, where = [], "read-back"
    for piece in pieces:
        if piece == eos:
            role = "end"
        elif piece == SPARK_MARK:
            role, where = "spark", "read-back"
        elif piece in CLOSERS:
            role = "closer"
        elif piece == SCRATCH:
            role, where = "other", "scratchpad"
        elif piece == CHECK_EQUALS:
            role, where = "other", "answer"
        elif piece.isdigit():
            role = where
        else:
            role = "other"
        roles.append(role)
    return roles


def analyse(config_path: str, overrides: list[str], batches: int) -> dict[str, Any]:
    from divrl.algorithms import logit_stats, lp_reg_selection
    from divrl.commands.train import with_toy_defaults
    from divrl.training.config import load_config
    from divrl.training.forward import response_logits, to_device
    from divrl.training.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        base = load_config(config_path, overrides)
        group = base.algorithm.lp_reg_group_size or base.train.micro_batch_size
        scope = [
            "algorithm.lp_reg_scope=micro_batch",
            "algorithm.lp_reg_group_size=null",
            "algorithm.lp_reg_micro_batch_tokens=null",
            "algorithm.lp_reg_balance_batch=false",
            f"train.micro_batch_size={group}",
        ]
        cfg = load_config(config_path, [*overrides, *scope, f"logging.output_dir={tmp}/run"])
        cfg = with_toy_defaults(cfg)
        trainer = Trainer(cfg)
        opts = cfg.algorithm.options
        eos = trainer.tokenizer.eos_token
        roles = {r: dict.fromkeys(COUNTS, 0) for r in ROLES}
        pops: list[dict[str, float]] = []
        trainer.model.train()
        for b in range(batches):
            exp, _, _ = trainer.experience.make(b)
            for lo in range(0, len(exp), group):
                idx = list(range(lo, min(lo + group, len(exp))))
                data = to_device(exp.model_inputs(idx), trainer.accelerator.device)
                with torch.no_grad():
                    logits = response_logits(trainer.model, data)
                    stats = logit_stats(
                        logits,
                        data["responses"],
                        cfg.rollout.temperature,
                        trainer.update.chunk,
                        minp_kappa=trainer.update.kappa,
                    )
                chosen = lp_reg_selection(
                    stats.log_prob,
                    stats.proxy_log_prob,
                    exp.advantages[idx],
                    data["response_mask"],
                    opts.rho,
                    opts.min_k,
                )
                n_neg = int(chosen.candidates.sum())
                k = max(1, math.floor(opts.rho * n_neg))
                pop = {"n_neg": n_neg, "k": k if k >= opts.min_k else 0}
                mask = data["response_mask"].bool()
                kinds = {"tokens": mask, "candidates": chosen.candidates}
                kinds |= {"selected": chosen.selected, "regularized": chosen.regularized}
                for row in range(mask.shape[0]):
                    n = int(mask[row].sum())
                    ids = data["responses"][row, :n].tolist()
                    pieces = trainer.tokenizer.convert_ids_to_tokens(ids)
                    for pos, role in enumerate(token_roles(pieces, eos)):
                        for kind, m in kinds.items():
                            if m[row, pos]:
                                roles[role][kind] += 1
                                if kind in ("selected", "regularized"):
                                    pop[f"{kind} {role}"] = pop.get(f"{kind} {role}", 0) + 1
                pops.append(pop)
            print(f"batch {b + 1}/{batches}", file=sys.stderr, flush=True)
    return {"config": config_path, "overrides": overrides, "roles": roles, "populations": pops}


def summary(res: dict[str, Any]) -> str:
    pops = res["populations"]
    n = len(pops)
    lines = [
        f"{n} populations: N_neg mean {sum(p['n_neg'] for p in pops) / n:.1f}, "
        f"k mean {sum(p['k'] for p in pops) / n:.2f}, "
        f"populations with k >= 2: {sum(p['k'] > 0 for p in pops)}",
        "| role | tokens | candidates | selected | regularised |",
        "|---|---|---|---|---|",
    ]
    for role, c in res["roles"].items():
        lines.append(f"| {role} | " + " | ".join(str(c[k]) for k in COUNTS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.sparks_lp_reg_tokens")
    p.add_argument("--config", default="configs/toy/sparks/lp_reg.yaml")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--out", help="write the counts here (JSON)")
    p.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = p.parse_args(argv)
    res = analyse(args.config, args.overrides, args.batches)
    if args.out:
        write_result(args.out, res)
    print(summary(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
