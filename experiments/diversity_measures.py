"""How the classifier-free diversity measures track the toy worlds' style classifiers.

Samples each toy world's base model at several temperatures (more temperature, more
diverse samples), then prints, per world, temperature and eval set, the mean styles per
prompt of the world's style classifier beside every measure of
:mod:`divrl.evaluation.text_diversity`, and the per-prompt Spearman correlation between the
classifier's style count and the trace-cluster count::

    python -m experiments.diversity_measures --out runs/diversity_measures

Samples already in ``--out`` are reused (delete the folder to resample). ``--evals
NAME=DIR ...`` tabulates existing ``divrl eval`` folders instead (trained models, e.g. the
demo's ``runs/demo/<method>/eval``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from experiments.records import ResultError, read_result, refuse_other_settings, write_result


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation with average ranks for ties (nan when one side is constant)."""

    def ranks(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        i = 0
        while i < len(x):
            j = i
            while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
                j += 1
            r[order[i : j + 1]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _check_settings(out: Path, settings: dict[str, Any]) -> None:
    """Samples in ``out`` are reused only when made with the same ``--prompts`` and
    ``--n`` (recorded in ``out/settings.json``)."""
    path = out / "settings.json"
    saved = read_result(path)
    fix = "use another --out for other settings, or move it away"
    if saved is None and any(out.glob("*/T*/*/results.jsonl")):
        raise ResultError(f"{out} holds samples without {path.name} (an older version): {fix}")
    if saved is not None:
        refuse_other_settings(path, saved, settings, fix)
    write_result(path, settings)


def sample(out: Path, worlds: list[str], temps: list[float], prompts: int, n: int) -> None:
    import torch

    from divrl.evaluation.runner import EvalConfig, evaluate, load_model
    from divrl.toy.worlds import eval_splits, get_world

    _check_settings(out, {"prompts": prompts, "n": n})
    torch.set_num_threads(1)
    for name in worlds:
        world = get_world(name, progress=False)
        model, tokenizer = None, None
        for t in temps:
            for split in eval_splits(world):
                target = out / name / f"T{t}" / split
                if (target / "results.jsonl").is_file():
                    continue
                if model is None:
                    model, tokenizer = load_model(world.model_dir)
                cfg = EvalConfig(n=n, temperature=t, max_new_tokens=80, limit=prompts, n_boot=200)
                evaluate(
                    None, world.splits[split], target, cfg, model=model, tokenizer=tokenizer,
                    progress=False,
                )  # fmt: skip


MEASURES = (
    "styles | trace clusters | rho | distinct-2 | self-BLEU | answers "
    "| answer entropy (bits) | math trace styles |"
)


def _cells(path: Path) -> str:
    """The measures of one ``results.jsonl`` as table cells."""
    from divrl.evaluation.runner import read_jsonl
    from divrl.evaluation.summary import per_prompt_arrays, text_diversity

    results = read_jsonl(path)
    styles = per_prompt_arrays(results)["styles"]
    m = text_diversity(results)
    rho = spearman(styles, m["trace_clusters"])
    mts = m.get("mean_math_trace_styles")
    return (
        f"{styles.mean():.2f} | {m['mean_trace_clusters']:.2f} | {rho:.2f} | "
        f"{m['distinct_2']:.3f} | {m['self_bleu']:.3f} | {m['mean_answer_clusters']:.2f} | "
        f"{m['mean_answer_entropy_bits']:.2f} | {'-' if mts is None else f'{mts:.2f}'} |"
    )


def table(out: Path) -> list[str]:
    """One row per world, temperature and eval set sampled into ``out``."""
    import divrl.toy  # noqa: F401  (registers the toy worlds' style classifiers)

    lines = [f"| world | T | eval set | {MEASURES}", "|---|---|---|" + "--:|" * 8]
    for path in sorted(out.glob("*/T*/*/results.jsonl")):
        world, temp, split = path.parts[-4:-1]
        lines.append(f"| {world} | {temp[1:]} | {split} | {_cells(path)}")
    return lines


def eval_table(evals: dict[str, Path]) -> list[str]:
    """One row per eval set and model of existing ``divrl eval`` folders (e.g. a demo's)."""
    import divrl.toy  # noqa: F401

    splits = sorted({p.parent.name for d in evals.values() for p in d.glob("*/results.jsonl")})
    lines = [f"| eval set | model | {MEASURES}", "|---|---|" + "--:|" * 8]
    for split in splits:
        for name, folder in evals.items():
            path = folder / split / "results.jsonl"
            if path.is_file():
                lines.append(f"| {split} | {name} | {_cells(path)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/diversity_measures", help="samples folder")
    parser.add_argument("--worlds", default="sql,countdown", help="toy worlds, comma-separated")
    parser.add_argument("--temperatures", default="0.6,1.0,1.4", help="comma-separated")
    parser.add_argument("--prompts", type=int, default=48, help="prompts per eval set")
    parser.add_argument("--n", type=int, default=16, help="samples per prompt")
    parser.add_argument(
        "--evals",
        nargs="+",
        metavar="NAME=DIR",
        help="instead: tabulate existing divrl eval folders (e.g. base=runs/demo/base/eval)",
    )
    args = parser.parse_args(argv)
    if args.evals:
        evals = dict(e.split("=", 1) for e in args.evals)
        print("\n".join(eval_table({k: Path(v) for k, v in evals.items()})))
        return 0
    out = Path(args.out)
    temps = [float(t) for t in args.temperatures.split(",")]
    try:
        sample(out, args.worlds.split(","), temps, args.prompts, args.n)
    except ResultError as exc:
        print(f"experiments.diversity_measures: {exc}", file=sys.stderr)
        return 2
    print("\n".join(table(out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
