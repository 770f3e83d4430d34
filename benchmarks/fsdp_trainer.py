"""Trainer step time and per-rank peak memory, ``train.strategy=fsdp`` vs ``ddp``, for GRPO,
DPH-JS and Lp-Reg, 2 processes (``torchrun``, gloo on CPU / NCCL on GPUs).

The cases, model, prompts and reward are those of :mod:`benchmarks.step_time` (a random-init
Llama on the toy prompts, a cheap deterministic reward); each (method, strategy) pair runs
in its own ``torchrun`` launch so that the peak RSS belongs to it alone. Per rank: the
median of the timed steps (after one warm-up step), split into rollout and update, and the
peak RSS (CUDA memory on a GPU). What FSDP changes in a trainer step: the rollout runs
inside ``full_parameters`` (one all-gather of the model per step), every forward/backward
all-gathers each layer and reduce-scatters its gradients, the optimiser steps on shards.

    python -m benchmarks.fsdp_trainer [--steps 3] [--hidden 256] [--layers 4] [--nproc 2]

With ``--nproc 1`` (``benchmarks/gpu.sh``) FSDP shards over one rank: a sanity check of the
FSDP path on a GPU (mixed precision, NCCL) and its overhead, not a memory saving.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.step_time import CASES, base_overrides, prepare, reward_fn

METHODS = ("grpo", "dph_js", "lp_reg")
STRATEGIES = ("ddp", "fsdp")


def rank_worker(spec_path: str) -> None:
    """One rank of one launch: train, time, write ``rank<r>.json`` next to the spec."""
    import torch

    from divrl.distributed import release_process_group

    out = _timed_steps(json.loads(Path(spec_path).read_text()))
    (Path(spec_path).parent / f"rank{out['rank']}.json").write_text(json.dumps(out))
    # the trainer (its DDP wrapper) is gone: release the group before the interpreter exits
    torch.distributed.barrier()
    release_process_group()


def _timed_steps(spec: dict) -> dict:
    """Train ``spec["steps"]`` + 1 steps; this rank's step times and peak memory."""
    import time

    import torch

    from benchmarks.common import peak_rss_bytes
    from divrl.training.config import load_config
    from divrl.training.trainer import Trainer

    torch.set_num_threads(spec["threads"])
    trainer = Trainer(load_config(None, spec["overrides"]), reward_fn=reward_fn)
    times, rollout, update = [], [], []
    for step in range(spec["steps"] + 1):
        t0 = time.perf_counter()
        metrics = trainer.train_step()
        if step > 0:  # the first step warms up allocators and caches
            times.append(time.perf_counter() - t0)
            rollout.append(metrics["time/rollout"])
            update.append(metrics["time/update"])
    cuda = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    return {
        "rank": trainer.rank,
        "step_times": times,
        "rollout_times": rollout,
        "update_times": update,
        "peak_bytes": cuda or peak_rss_bytes(),
        "sharded": trainer.sharded,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(work: Path, name: str, overrides: list[str], opts: argparse.Namespace) -> list[dict]:
    case = work / "launches" / name
    case.mkdir(parents=True)
    spec = {"overrides": overrides, "steps": opts.steps, "threads": opts.threads}
    (case / "spec.json").write_text(json.dumps(spec))
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads), "PYTHONWARNINGS": "ignore"}
    cmd = [str(torchrun), "--nproc_per_node", str(opts.nproc), "--master_addr", "127.0.0.1"]
    cmd += ["--master_port", str(_free_port()), "-m", "benchmarks.fsdp_trainer"]
    proc = subprocess.run(
        [*cmd, "--rank-worker", str(case / "spec.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    files = [case / f"rank{r}.json" for r in range(opts.nproc)]
    if proc.returncode != 0 and not all(f.is_file() for f in files):
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    if proc.returncode != 0:  # seen 2 times in ~10 fsdp launches on this CPU (report)
        print(
            f"{name}: exit code {proc.returncode} after the results were written; "
            f"{proc.stderr.strip().splitlines()[-1:]}",
            file=sys.stderr,
        )
    return [{**json.loads(f.read_text()), "exit_code": proc.returncode} for f in files]


def report(results: dict[str, list[dict]]) -> str:
    from benchmarks.common import markdown_table, summary

    def med(name: str, key: str) -> float:
        return summary([t for rank in results[name] for t in rank[key]])["median"]

    def peak(name: str) -> float:
        return max(rank["peak_bytes"] for rank in results[name]) / 2**20

    rows = []
    for method in METHODS:
        for strategy in STRATEGIES:
            name = f"{method}/{strategy}"
            rows.append(
                [
                    method,
                    strategy,
                    f"{med(name, 'step_times'):.3f}",
                    f"{med(name, 'rollout_times'):.3f}",
                    f"{med(name, 'update_times'):.3f}",
                    f"{peak(name):.0f}",
                ]
            )
    ratios = [
        [
            method,
            f"{med(f'{method}/fsdp', 'step_times') / med(f'{method}/ddp', 'step_times'):.3f}x",
            f"{peak(f'{method}/fsdp') / peak(f'{method}/ddp'):.3f}x",
        ]
        for method in METHODS
    ]
    headers = ["method", "strategy", "step s", "rollout s", "update s", "peak MiB per rank"]
    table = markdown_table(headers, rows)
    return table + "\n" + markdown_table(["method", "step time fsdp/ddp", "peak fsdp/ddp"], ratios)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after 1 warm-up)")
    parser.add_argument("--nproc", type=int, default=2, help="processes (ranks)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--response-len", type=int, default=32)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--engine", default="hf", choices=["hf"])
    parser.add_argument(
        "--param-dtype",
        default=None,
        choices=["bfloat16"],
        help="fsdp runs: train.param_dtype (bf16 compute over float32 masters, on a GPU)",
    )
    opts = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="divrl-bench-fsdp-trainer-"))
    prepare(work, opts)
    # DPH-JS: divisible by processes x mini-batches, as train.strategy=fsdp requires
    ref_per_step = max(opts.nproc, opts.prompts * opts.n // 8 // opts.nproc * opts.nproc)
    results: dict[str, list[dict]] = {}
    for method in METHODS:
        for strategy in STRATEGIES:
            extra = [e.format(ref_per_step=ref_per_step) for e in CASES[method]]
            overrides = base_overrides(work, opts) + extra + [f"train.strategy={strategy}"]
            if strategy == "fsdp" and opts.param_dtype:
                overrides.append(f"train.param_dtype={opts.param_dtype}")
            name = f"{method}/{strategy}"
            results[name] = launch(work, name.replace("/", "_"), overrides, opts)
            times = [t for r in results[name] for t in r["step_times"]]
            print(f"{name}: {times}", file=sys.stderr, flush=True)
    table = report(results)
    payload = {"settings": vars(opts), "ref_per_step": ref_per_step, "results": results}
    write_results("fsdp_trainer", payload, table)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank-worker"]:
        rank_worker(sys.argv[2])
    else:
        from benchmarks.common import entry_point

        entry_point(main)
