"""Length-bucketed micro-batches vs arrival order: update time and padding on real lengths.

The other trainer benchmarks use a random-init model whose responses all run to the length
limit, where bucketing cannot matter. Here the toy world's trained base model answers SQL
and math prompts in 5 to 80 tokens, so the padded micro-batches of a GRPO step differ:

- ``bucketed``: ``train.length_bucketing=true`` (the default): each mini-batch sorted by
  prompt + response length before it is cut into micro-batches;
- ``arrival``: ``train.length_bucketing=false``: micro-batches in rollout order.

Both run ``configs/toy/grpo.yaml`` (the toy world from the default cache) (32 prompts x 8 responses per step) with the same seed,
so their first rollouts are identical; the update time (``time/update``: forward, backward
and optimiser step) and the padded share of the micro-batches are compared.

    python -m benchmarks.bucketing [--steps 3] [--repeats 2] [--micro 64]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

PRESET = Path(__file__).resolve().parents[1] / "configs" / "toy" / "grpo.yaml"
CASES = {"bucketed": True, "arrival": False}


def child(args: dict) -> dict:
    import torch

    from benchmarks.common import peak_rss_bytes
    from divrl.commands.train import with_toy_defaults
    from divrl.training.config import load_config
    from divrl.training.trainer import Trainer

    torch.set_num_threads(args["threads"])
    trainer = Trainer(with_toy_defaults(load_config(str(PRESET), args["overrides"])))
    update, padding = [], []
    for step in range(args["steps"] + 1):
        metrics = trainer.train_step()
        if step > 0:  # the first step warms up allocators and caches
            update.append(metrics["time/update"])
            padding.append(metrics["perf/padding_frac"])
    return {"update_times": update, "padding_frac": padding, "peak_rss_bytes": peak_rss_bytes()}


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import markdown_table, run_child, summary, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=2, help="processes per case")
    parser.add_argument("--micro", type=int, default=64, help="train.micro_batch_size")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    opts = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="divrl-bench-bucketing-"))
    results: dict[str, dict] = {name: {"update": [], "padding": [], "raw": []} for name in CASES}
    for repeat in range(opts.repeats):
        for name, on in CASES.items():
            overrides = [
                f"train.length_bucketing={str(on).lower()}",
                f"train.micro_batch_size={opts.micro}",
                f"train.total_steps={opts.steps + 1}",
                f"logging.output_dir={work / 'runs' / name}",
                "logging.progress=false",
                "logging.tensorboard=false",
                "checkpoint.save_every=0",
                "checkpoint.save_final=false",
            ]
            out = run_child(
                "benchmarks.bucketing",
                {"overrides": overrides, "steps": opts.steps, "threads": opts.threads},
            )
            results[name]["update"] += out["update_times"]
            results[name]["padding"] += out["padding_frac"]
            results[name]["raw"].append(out)
            print(f"[{repeat}] {name}: {summary(out['update_times'])}", file=sys.stderr, flush=True)

    med = {name: summary(r["update"])["median"] for name, r in results.items()}
    rows = []
    for name, r in results.items():
        s = summary(r["update"])
        rows.append(
            [
                name,
                f"{s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]",
                f"{sum(r['padding']) / len(r['padding']):.3f}",
            ]
        )
    ratio = med["bucketed"] / med["arrival"]
    table = markdown_table(
        ["micro-batches", "update time s (median [min, max])", "padded share of cells"], rows
    )
    table += "\n" + markdown_table(
        ["ratio", "measured"], [["bucketed / arrival, update time", f"{ratio:.3f}x"]]
    )
    payload = {
        "settings": vars(opts),
        "preset": str(PRESET.relative_to(PRESET.parents[2])),
        "results": {
            k: {"update_times": v["update"], "padding_frac": v["padding"]}
            for k, v in results.items()
        },
        "ratio_update_time": ratio,
    }
    write_results("bucketing", payload, table)
    return 0


if __name__ == "__main__":
    from benchmarks.common import entry_point

    entry_point(main, child)
