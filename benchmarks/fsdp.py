"""Per-rank peak memory and step time of FSDP2 vs DDP, 2 processes (``torchrun``), and the
memory of the two ways to roll out from sharded weights.

Each strategy runs in its own ``torchrun --nproc_per_node 2`` launch on the same
random-init Llama (~25M parameters by default), the same per-rank batch of random tokens
and AdamW. A plain language-model step (forward, backward, optimiser step): the model
state (parameters, gradients, AdamW moments) is what FSDP shards, and it dominates at
this size with short sequences. Per rank and phase (the kernel's peak-RSS counter is reset
between phases through ``/proc/self/clear_refs``):

- ``setup``: load the full model, wrap it (DDP) or shard it (FSDP), build the optimiser;
- ``train``: the training steps (the figure the goal is about);
- ``rollout``: greedy ``generate()`` after training: DDP with its own copy; FSDP once with
  :func:`divrl.training.fsdp.full_parameters` (unshard/reshard) and once with
  :func:`divrl.training.fsdp.gathered_copy`; the figure is the peak above the RSS before.

Goals: per-rank training peak fsdp / ddp <= 0.65x; step time <= 1.3x. The
trainer's GRPO / DPH-JS / Lp-Reg steps under ``train.strategy=fsdp`` vs ``ddp``:
:mod:`benchmarks.fsdp_trainer`.

    python -m benchmarks.fsdp [--steps 3] [--hidden 512] [--layers 8]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STRATEGIES = ("ddp", "fsdp")


def _hwm_bytes() -> int:
    """Peak RSS since the last :func:`_reset_peak` (VmHWM)."""
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) * 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _build_model(args: dict):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args["vocab"],
        hidden_size=args["hidden"],
        intermediate_size=args["hidden"] * 8 // 3,
        num_hidden_layers=args["layers"],
        num_attention_heads=max(1, args["hidden"] // 64),
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(config)


def _rollout_peak(context, model, generate) -> dict:
    """Peak RSS above the RSS before, of entering ``context(model)`` (gathering), generating
    with what it yields, and leaving it (resharding/freeing)."""
    from benchmarks.common import rss_bytes

    _reset_peak()
    before = rss_bytes()
    t0 = time.perf_counter()
    with context(model) as full:
        generate(full)
    return {"peak_above_bytes": _hwm_bytes() - before, "seconds": time.perf_counter() - t0}


def rank_worker(args: dict) -> dict:
    """One rank of one strategy (run under torchrun)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from transformers import LlamaForCausalLM  # noqa: F401  (imported before the baseline)

    from benchmarks.common import rss_bytes
    from divrl.training.fsdp import FSDPConfig, apply_fsdp, full_parameters, gathered_copy

    torch.set_num_threads(args["threads"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    baseline = rss_bytes()
    _reset_peak()
    model = _build_model(args)
    params = sum(p.numel() for p in model.parameters())
    if args["gradient_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args["strategy"] == "fsdp":
        train_model = apply_fsdp(model, FSDPConfig(strategy="fsdp"))
    else:
        train_model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(train_model.parameters(), lr=1e-5)
    setup_peak = _hwm_bytes()
    generator = torch.Generator().manual_seed(rank)
    batch = torch.randint(3, args["vocab"], (args["batch"], args["seq"]), generator=generator)
    _reset_peak()
    times = []
    for step in range(args["steps"] + 1):
        t0 = time.perf_counter()
        train_model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step > 0:  # the first step allocates the AdamW state
            times.append(time.perf_counter() - t0)
    train_peak = _hwm_bytes()
    model.eval()
    prompt = batch[:2, :16]

    def generate(m) -> None:
        with torch.no_grad():
            # full weights in hand: no per-token sync across ranks (see full_parameters)
            m.generate(
                prompt, max_new_tokens=args["new_tokens"], do_sample=False, synced_gpus=False
            )

    rss_after_train = rss_bytes()
    rollouts = {}
    if args["strategy"] == "fsdp":
        for name, context in (("unshard", full_parameters), ("gathered_copy", gathered_copy)):
            rollouts[name] = _rollout_peak(context, model, generate)
    else:
        rollouts["own_copy"] = _rollout_peak(contextlib.nullcontext, model, generate)
    dist.destroy_process_group()
    return {
        "rank": rank,
        "params": params,
        "baseline_bytes": baseline,
        "setup_peak_bytes": setup_peak,
        "train_peak_bytes": train_peak,
        "rss_after_train_bytes": rss_after_train,
        "step_times": times,
        "rollouts": rollouts,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(strategy: str, opts: argparse.Namespace, work: Path) -> list[dict]:
    """One ``torchrun --nproc_per_node N`` of :func:`rank_worker`; its ranks' results."""
    args = {**vars(opts), "strategy": strategy, "out": str(work / strategy)}
    work.mkdir(parents=True, exist_ok=True)
    spec = work / f"{strategy}.json"
    spec.write_text(json.dumps(args))
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads), "PYTHONWARNINGS": "ignore"}
    if opts.mmap_threshold > 0:
        # A fixed threshold turns off glibc's dynamic one, which after the first large free
        # rises to 32 MiB and then keeps freed per-layer buffers (FSDP's all-gathers, DDP's
        # buckets) in the heap: RSS would count memory the process no longer uses.
        env["MALLOC_MMAP_THRESHOLD_"] = str(opts.mmap_threshold)
    cmd = [str(torchrun), "--nproc_per_node", str(opts.nproc), "--master_addr", "127.0.0.1"]
    cmd += ["--master_port", str(_free_port()), "-m", "benchmarks.fsdp", "--rank", str(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"{strategy} failed:\n{proc.stderr[-3000:]}")
    return [json.loads(p.read_text()) for p in sorted((work / strategy).glob("rank*.json"))]


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after 1 warm-up)")
    parser.add_argument("--nproc", type=int, default=2, help="processes (ranks)")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    parser.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="recompute activations in the backward (both strategies)",
    )
    parser.add_argument("--new-tokens", type=int, default=16, help="rollout: greedy tokens")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--repeats", type=int, default=1, help="launches per strategy")
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        default=1 << 20,
        help="glibc MALLOC_MMAP_THRESHOLD_ for the ranks (0: glibc's dynamic default)",
    )
    opts = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="divrl-bench-fsdp-"))
    results: dict[str, list[dict]] = {s: [] for s in STRATEGIES}
    for repeat in range(opts.repeats):  # alternate, so that a load change hits both
        for strategy in STRATEGIES:
            results[strategy] += launch(strategy, opts, work / str(repeat))
            print(f"[{repeat}] {strategy}: done", file=sys.stderr, flush=True)
    table, ratios = report(results)
    write_results("fsdp", {"settings": vars(opts), "results": results, "ratios": ratios}, table)
    return 0


def report(results: dict[str, list[dict]]) -> tuple[str, dict[str, float]]:
    """The Markdown tables (per strategy, per rollout mode, goals) and the ratios."""
    import statistics

    from benchmarks.common import markdown_table

    mib = 2**20

    def worst(strategy: str, key: str) -> float:
        return max(r[key] for r in results[strategy]) / mib

    def above(strategy: str) -> float:  # training peak above the RSS after imports
        return max(r["train_peak_bytes"] - r["baseline_bytes"] for r in results[strategy]) / mib

    def step(strategy: str) -> float:
        return statistics.median(t for r in results[strategy] for t in r["step_times"])

    rows = [
        [
            s,
            results[s][0]["params"],
            f"{worst(s, 'baseline_bytes'):.0f}",
            f"{worst(s, 'setup_peak_bytes'):.0f}",
            f"{worst(s, 'train_peak_bytes'):.0f}",
            f"{above(s):.0f}",
            f"{step(s):.3f}",
        ]
        for s in STRATEGIES
    ]
    headers = ["strategy", "params", "RSS after imports MiB", "setup peak MiB", "train peak MiB"]
    headers += ["train peak above imports MiB", "step time s (median)"]
    table = markdown_table(headers, rows)

    def rollout_row(s: str, mode: str) -> list:
        peak = max(r["rollouts"][mode]["peak_above_bytes"] for r in results[s]) / mib
        seconds = statistics.median(r["rollouts"][mode]["seconds"] for r in results[s])
        return [s, mode, f"{peak:.0f}", f"{seconds:.3f}"]

    modes = [rollout_row(s, mode) for s in STRATEGIES for mode in results[s][0]["rollouts"]]
    table += "\n" + markdown_table(
        ["strategy", "rollout weights", "peak above before MiB (worst rank)", "generate s"], modes
    )
    ratios = {
        "train_peak_fsdp_vs_ddp": worst("fsdp", "train_peak_bytes")
        / worst("ddp", "train_peak_bytes"),
        "train_peak_above_imports_fsdp_vs_ddp": above("fsdp") / above("ddp"),
        "step_time_fsdp_vs_ddp": step("fsdp") / step("ddp"),
    }
    goals = [
        ["per-rank train peak RSS fsdp / ddp", ratios["train_peak_fsdp_vs_ddp"], "<= 0.65x"],
        ["same, above the RSS after imports", ratios["train_peak_above_imports_fsdp_vs_ddp"], "-"],
        ["step time fsdp / ddp", ratios["step_time_fsdp_vs_ddp"], "<= 1.3x"],
    ]
    for goal in goals:
        limit = goal[2]
        goal[1] = f"{goal[1]:.3f}x"
        met = limit == "-" or float(goal[1][:-1]) <= float(limit[3:-1])
        goal.append("-" if limit == "-" else ("met" if met else "not met"))
    table += "\n" + markdown_table(["ratio", "measured", "goal", "status"], goals)
    return table, ratios


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        spec = json.loads(Path(sys.argv[2]).read_text())
        out = Path(spec["out"])
        out.mkdir(parents=True, exist_ok=True)
        result = rank_worker(spec)
        (out / f"rank{result['rank']}.json").write_text(json.dumps(result))
        sys.exit(0)
    sys.exit(main())
