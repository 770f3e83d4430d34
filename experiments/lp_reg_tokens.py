"""Which tokens Lp-Reg selects and regularises on the countdown world, by their role in the
search trace.

The countdown reproduction (docs/results/countdown_reproduction_reading.md) found Lp-Reg
acting on every step (~84 tokens selected, ~30 regularised) and still ending with *less*
entropy and fewer answer styles than GRPO. This measures what it acts on: a trace
``7+9=16,16*3=48 no; 9*5=45,45-3=42 ok`` is made of choices (the first number of an
attempt, the operators, the other operands; the second step uses the first result and a
third number, in either order), computed results (after ``=``: one right value, so a low-probability digit there
is an arithmetic slip), verdicts and punctuation. The Lp-Reg paper's "reasoning sparks" are
low-probability *choices*; protecting slips protects errors.

For a model (the preset's base model, or a checkpoint with ``--model``) it draws
``--batches`` rollout batches exactly as training step 1, 2, ... would (the trainer's own
experience stage: prompts, sampling, rewards, group advantages), runs the trainer's
micro-batches through the policy, applies Lp-Reg's selection
(:func:`divrl.algorithms.lp_reg_selection`, the loss's own), and counts tokens by role:
all response tokens, negative-advantage candidates, selected, regularised. Batch 1 of the
base model at seed 0 is the reproduction's training step 1 (its ``lp_reg/num_selected`` /
``num_regularized`` in ``metrics.jsonl``).

Usage (from the repository root; minutes on the CPU)::

    .venv/bin/python -m experiments.lp_reg_tokens --batches 10 --out lp_tokens_base.json
    .venv/bin/python -m experiments.lp_reg_tokens --model RUN/checkpoints/step_000150/model \\
        --batches 10 --out lp_tokens_150.json
    .venv/bin/python -m experiments.lp_reg_tokens --report a.json b.json   # the tables
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from experiments.records import ResultError, read_result, write_result

#: the trace roles, in the order the tables list them
ROLES = (
    "attempt start",
    "operator +",
    "operator -",
    "operator *",
    "operand, step 1",
    "operand, step 2",
    "illegal number",
    "result",
    "verdict",
    "punctuation",
    "end",
)
COUNTS = ("tokens", "candidates", "selected", "regularized")
_OPERATORS = ("+", "-", "*", "/")
_VERDICTS = ("no;", "ok")
_PROBLEM = re.compile(r"CD: ([\d ]+) -> (\d+)")  # the prompt: the numbers and the target


def _legal(attempt: str, piece: str, numbers: tuple[int, ...]) -> bool | None:
    """Whether ``piece`` continues an operand that can still be legal: a given number not
    yet used in the attempt or, in the second step, the first step's result as written
    (None when the first step cannot be read)."""
    steps = attempt.split(",")
    *done, current = re.split(r"[+\-*/]", steps[-1])
    pool = list(numbers)
    if len(steps) > 1:
        first = re.fullmatch(r"(\d+)[+\-*/](\d+)=(-?\d+)", steps[0])
        if first is None:
            return None
        used = [int(first.group(1)), int(first.group(2))]
        pool = [n for n in pool if n not in used] + [int(first.group(3))]
    for text in done:
        if text.isdigit() and int(text) in pool:
            pool.remove(int(text))
    return any(str(n).startswith(current + piece) for n in pool)


def token_roles(pieces: list[str], eos: str, numbers: tuple[int, ...] | None = None) -> list[str]:
    """The role of each token of a countdown response (a list of token strings).

    ``attempt start``: the first number of an attempt (the search's branching choice);
    ``operator +/-/*``: an operator of a step; ``operand, step 1``: the rest of the first
    step's operands; ``operand, step 2``: the second step's operands (the first result and
    the third number, in either order); ``result``: a character after ``=`` (the computed
    value: one right answer); ``verdict``: `` no; `` / `` ok``; ``end``: the
    end-of-sequence token; ``punctuation``: ``=``, ``,`` and anything else. With the
    problem's ``numbers``, an operand digit that no legal operand starts with (a number
    not given, used twice, or a second-step operand that is neither the first result nor
    an unused number) is an ``illegal number``.
    """
    roles, attempt = [], ""
    for piece in pieces:
        step = attempt.rsplit(",", 1)[-1]
        if piece == eos:
            role = "end"
        elif piece.strip() in _VERDICTS:
            role = "verdict"
        elif "=" in step and (piece.isdigit() or piece in _OPERATORS):
            role = "result"  # a digit or the sign of a computed value
        elif piece in _OPERATORS:
            role = f"operator {piece}" if f"operator {piece}" in ROLES else "punctuation"
        elif piece.isdigit():
            second = "," in attempt
            role = "attempt start" if attempt == "" else f"operand, step {1 + second}"
            if numbers is not None and _legal(attempt, piece, numbers) is False:
                role = "illegal number"
        else:
            role = "punctuation"
        roles.append(role)
        attempt = "" if role == "verdict" else attempt + piece
    return roles


def _empty() -> dict[str, Any]:
    return {role: dict.fromkeys((*COUNTS, "prob_sum"), 0.0) for role in ROLES}


def analyse(config_path: str, overrides: list[str], batches: int) -> dict[str, Any]:
    """Counts by role over ``batches`` rollout batches of the config's model (see module)."""
    # lazy: the experiment's --help and --report need no model stack
    from divrl.algorithms import lp_reg_selection
    from divrl.commands.train import with_toy_defaults
    from divrl.training.config import load_config
    from divrl.training.forward import response_logits, to_device
    from divrl.training.trainer import Trainer
    from divrl.training.update import split

    with tempfile.TemporaryDirectory() as tmp:
        # the counts are per divrl micro-batch (the selection population of the runs it
        # explains), whatever population the preset selects in; an override can change it
        scope = [
            "algorithm.lp_reg_scope=micro_batch",
            "algorithm.lp_reg_group_size=null",
            "algorithm.lp_reg_micro_batch_tokens=null",
            "algorithm.lp_reg_balance_batch=false",
        ]
        cfg = load_config(config_path, [*scope, *overrides, f"logging.output_dir={tmp}/run"])
        cfg = with_toy_defaults(cfg)  # a null model.path: the preset's toy world, as divrl train
        algo = cfg.algorithm
        if algo.policy_loss != "lp_reg" or algo.lp_reg_scope != "micro_batch":
            raise SystemExit("the config must train Lp-Reg with algorithm.lp_reg_scope=micro_batch")
        trainer = Trainer(cfg)
        opts = algo.options  # typed, validated by the config
        roles, per_batch = _empty(), []
        eos = trainer.tokenizer.eos_token
        trainer.model.train()  # as in the training step
        for b in range(batches):
            exp, _, _ = trainer.experience.make(b)
            totals = Counter()
            for seqs in split(range(len(exp)), cfg.train.num_mini_batches):
                for idx in trainer.update.micro_batches(exp, seqs):
                    data = to_device(exp.model_inputs(idx), trainer.accelerator.device)
                    with torch.no_grad():
                        stats = _stats(trainer, cfg, response_logits(trainer.model, data), data)
                    chosen = lp_reg_selection(
                        stats.log_prob,
                        stats.proxy_log_prob,
                        exp.advantages[idx],
                        data["response_mask"],
                        opts.rho,
                        opts.min_k,
                    )
                    _count(roles, totals, trainer.tokenizer, eos, data, stats.log_prob, chosen)
            per_batch.append(
                {k: int(totals[k]) for k in COUNTS} | {"reward": float(exp.scores.mean())}
            )
            print(f"batch {b + 1}/{batches}: {per_batch[-1]}", file=sys.stderr, flush=True)
    return {"config": config_path, "overrides": overrides, "batches": per_batch, "roles": roles}


def _stats(trainer, cfg, logits: torch.Tensor, data: dict[str, torch.Tensor]):
    from divrl.algorithms import logit_stats

    return logit_stats(
        logits,
        data["responses"],
        cfg.rollout.temperature,
        trainer.update.chunk,
        minp_kappa=trainer.update.kappa,
    )


def _count(roles, totals, tokenizer, eos, data, log_prob, chosen) -> None:
    """Add one micro-batch's tokens to the per-role and per-batch counts."""
    mask = data["response_mask"].bool()
    probs = torch.exp(log_prob.float())
    kinds = {"tokens": mask, "candidates": chosen.candidates, "selected": chosen.selected}
    kinds["regularized"] = chosen.regularized
    for row in range(mask.shape[0]):
        n = int(mask[row].sum())
        pieces = tokenizer.convert_ids_to_tokens(data["responses"][row, :n].tolist())
        ids = data["input_ids"][row][data["attention_mask"][row].bool()].tolist()
        problem = _PROBLEM.search(tokenizer.decode(ids))
        numbers = tuple(int(x) for x in problem.group(1).split()) if problem else None
        for pos, role in enumerate(token_roles(pieces, eos, numbers)):
            for kind, m in kinds.items():
                if m[row, pos]:
                    roles[role][kind] += 1
                    totals[kind] += 1
            roles[role]["prob_sum"] += float(probs[row, pos])


def report(groups: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown: for each label with one result, its per-role table (share of each count);
    with more than one label, the side-by-side :func:`comparison` (mean +- sd over a
    label's results, e.g. its seeds)."""
    lines = []
    for label, (res, *more) in groups.items():
        if more:
            continue
        roles = res["roles"]
        total = {k: sum(r[k] for r in roles.values()) or 1 for k in COUNTS}
        n = len(res["batches"])
        lines += [
            f"**{label}** ({n} batches; per batch: "
            + ", ".join(f"{k} {total[k] / n:.1f}" for k in COUNTS)
            + ")",
            "",
            "| role | tokens | mean prob | candidates | selected | regularised |",
            "|---|---|---|---|---|---|",
        ]
        for role in ROLES:
            r = roles[role]
            mean = r["prob_sum"] / r["tokens"] if r["tokens"] else float("nan")
            shares = " | ".join(f"{100 * r[k] / total[k]:.1f}%" for k in COUNTS[1:])
            lines.append(
                f"| {role} | {100 * r['tokens'] / total['tokens']:.1f}% | {mean:.3f} | {shares} |"
            )
        lines.append("")
    if len(groups) > 1 or any(len(g) > 1 for g in groups.values()):
        lines += comparison(groups)
    return "\n".join(lines)


def subtraction_share(roles: dict[str, dict[str, float]], kind: str = "tokens") -> float:
    """Share of ``-`` among the operator tokens of ``kind`` (the world's rare choice)."""
    ops = [roles[f"operator {op}"][kind] for op in "+-*"]
    return ops[1] / sum(ops) if sum(ops) else float("nan")


def _spread(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    """``mean`` or ``mean ± sd`` (sample sd) of ``values`` times ``scale``."""
    mean = statistics.fmean(values) * scale
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values) * scale:.{digits}f}"


def _share(res: dict[str, Any], role: str, kind: str) -> float:
    total = sum(r[kind] for r in res["roles"].values())
    return res["roles"][role][kind] / total if total else 0.0


def comparison(groups: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Markdown lines: per role, its share (%) of all tokens and of the regularised ones,
    side by side for each label (mean ± sd over its results); then the regularised tokens
    per batch and the share (%) of ``-`` among the sampled operators."""
    head = " | ".join(f"{lab}: tokens | {lab}: regularised" for lab in groups)
    lines = [f"| role | {head} |", "|---|" + "---|" * (2 * len(groups))]
    for role in ROLES:
        cells = [
            _spread([_share(res, role, kind) for res in results])
            for results in groups.values()
            for kind in ("tokens", "regularized")
        ]
        lines.append(f"| {role} | " + " | ".join(cells) + " |")
    per_batch = [
        f"{lab}: "
        + _spread(
            [
                sum(r["regularized"] for r in res["roles"].values()) / len(res["batches"])
                for res in rs
            ],
            scale=1.0,
        )
        for lab, rs in groups.items()
    ]
    minus = [
        f"{lab}: " + _spread([subtraction_share(res["roles"]) for res in rs])
        for lab, rs in groups.items()
    ]
    lines += ["", "Regularised per batch: " + ", ".join(per_batch) + "."]
    lines += ["Share of `-` among sampled operators (%): " + ", ".join(minus) + ".", ""]
    return lines


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ResultError(f"{path}: no such file (give the --out of an earlier run)")
    return read_result(path)


def _report_groups(specs: list[str]) -> dict[str, list[dict[str, Any]]]:
    """``LABEL=a.json,b.json`` (or a file, labelled by its name) -> label -> results."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for spec in specs:
        label, _, files = spec.rpartition("=") if "=" in spec else (Path(spec).stem, "", spec)
        groups[label] = [_read(Path(f)) for f in files.split(",")]
    return groups


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m experiments.lp_reg_tokens", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--config", default="configs/toy/countdown/lp_reg.yaml", help="an Lp-Reg preset")
    p.add_argument("--model", help="model directory to analyse (default: the preset's base model)")
    p.add_argument("--seed", type=int, default=0, help="train.seed: which prompts and samples")
    p.add_argument("--batches", type=int, default=10, help="rollout batches (training steps 1..N)")
    p.add_argument("--out", help="write the counts here (JSON)")
    p.add_argument(
        "--report",
        nargs="+",
        metavar="JSON",
        help="print the tables of these results only; LABEL=a.json,b.json groups results "
        "(e.g. seeds) under one label, shown as mean ± sd",
    )
    p.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = p.parse_args(argv)
    if args.report:
        try:
            print(report(_report_groups(args.report)))
        except ResultError as exc:
            print(f"experiments.lp_reg_tokens: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.batches < 1:
        p.error("--batches must be >= 1")
    if args.model and not (Path(args.model) / "config.json").is_file():
        p.error(f"--model {args.model}: no config.json there (give a checkpoint's model/ folder)")
    overrides = [*args.overrides, f"train.seed={args.seed}", "logging.progress=false"]
    overrides += ["logging.tensorboard=false"] + (
        [f"model.path={args.model}"] if args.model else []
    )
    res = analyse(args.config, overrides, args.batches)
    res["model"] = args.model or "base"
    if args.out:
        write_result(args.out, res)
    print(report({res["model"]: [res]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
