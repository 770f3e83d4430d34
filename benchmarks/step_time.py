"""Trainer step time and peak memory per method, side by side on the same model and batch.

Cases (each in its own process, so the peak RSS is that method's alone), all on the same
random-init Llama, the same prompts and response lengths, and a cheap deterministic reward
so that verifier time does not blur the comparison:

- ``grpo``: the clipped surrogate only;
- ``grpo_rkl``: GRPO + online reverse KL (k3, beta 0.01): loads a frozen reference model
  and runs its forward every step;
- ``dph_js``: DPH-JS (eta 0.2) on a presampled reference store, one reference sample per
  8 rollouts; no reference model;
- ``lp_reg``: on-policy Lp-Reg, the proxy from the training forward's own logits.

Goals (issue 9): dph_js <= 0.85x grpo_rkl time with no reference model in memory; lp_reg
<= 1.05x grpo time and memory.

Besides wall-clock, each step's CPU time of the process (``time.process_time``) is
recorded: on a shared machine it moves much less with the other load than wall-clock does.

    python -m benchmarks.step_time [--steps 4] [--repeats 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

CASES = {
    "grpo": [],
    "grpo_rkl": ["algorithm.kl_coef=0.01", "algorithm.kl_estimator=k3"],
    "dph_js": [
        "algorithm.divergence=js",
        "algorithm.divergence_coef=0.2",
        "reference.per_step={ref_per_step}",
    ],
    "lp_reg": [
        "algorithm.policy_loss=lp_reg",
        "algorithm.clip_low=1.0",
        "algorithm.clip_high=9.0",
    ],
}


def reward_fn(items: list) -> list[float]:
    """Deterministic, cheap: a quarter of the prompts always 'solved', else by text parity.

    Items are ``ScoreRequest``s; plain dicts (what commits before the typed requests pass)
    are read too, so that this script can time an older tree for a before/after comparison.
    """
    out = []
    for item in items:
        gt = str(_field(item, "ground_truth"))
        solved = sum(map(ord, gt)) % 4 == 0
        out.append(1.0 if solved else float(sum(map(ord, _field(item, "solution_str"))) % 2))
    return out


def _field(item, name: str):
    return item[name] if isinstance(item, dict) else getattr(item, name)


def base_overrides(work: Path, args: argparse.Namespace) -> list[str]:
    return [
        f"model.path={work / 'model'}",
        f"data.train_path={work / 'toy' / 'train.jsonl'}",
        "data.max_prompt_length=64",
        "data.limit=48",
        f"rollout.n={args.n}",
        f"rollout.max_new_tokens={args.response_len}",
        "rollout.seeded=false",
        f"train.prompts_per_step={args.prompts}",
        f"train.micro_batch_size={args.micro}",
        f"train.total_steps={args.steps + 1}",
        "optim.lr=1e-5",
        f"reference.store={work / 'reference'}",
        "reference.k=4",
        f"logging.output_dir={work / 'runs'}",
        "logging.tensorboard=false",
        "logging.progress=false",
        "checkpoint.save_every=0",
        "checkpoint.save_final=false",
        f"model.dtype={args.dtype}",
        f"rollout.engine={args.engine}",
        # prompts per generate call: an option of the in-process engines only
        *(
            [f"rollout.engine_options.batch_size={args.prompts}"]
            if args.engine in ("hf", "static")
            else []
        ),
    ]


def prepare(work: Path, args: argparse.Namespace, presample_store: bool = True) -> None:
    """Toy data + tokenizer, a bigger random-init Llama on them, and a reference store."""
    import shutil

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from divrl.toy import ensure_toy_world
    from divrl.training.config import load_config
    from divrl.training.presample import presample

    torch.set_num_threads(args.threads)
    world = ensure_toy_world(work / "toycache", size="tiny", progress=False)
    (work / "toy").mkdir(parents=True, exist_ok=True)
    shutil.copy(world.splits["train"], work / "toy" / "train.jsonl")
    tokenizer = AutoTokenizer.from_pretrained(world.model_dir)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    if presample_store:
        cfg = load_config(None, base_overrides(work, args))
        presample(cfg, reward_fn=reward_fn, progress=False)


def child(args: dict) -> dict:
    import time

    import torch

    from benchmarks.common import peak_rss_bytes
    from divrl.training.config import load_config
    from divrl.training.trainer import Trainer

    torch.set_num_threads(args["threads"])
    config = load_config(None, args["overrides"])
    trainer = Trainer(config, reward_fn=reward_fn)
    times, cpu_times, rollout, update = [], [], [], []
    for step in range(args["steps"] + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        metrics = trainer.train_step()
        if step > 0:  # the first step warms up allocators and caches
            times.append(time.perf_counter() - t0)
            # this process's CPU seconds: less sensitive than wall-clock to other load
            cpu_times.append(time.process_time() - c0)
            rollout.append(metrics["time/rollout"])
            update.append(metrics["time/update"])
    params = sum(p.numel() for p in trainer.model.parameters())
    return {
        "step_times": times,
        "cpu_step_times": cpu_times,
        "rollout_times": rollout,
        "update_times": update,
        "peak_rss_bytes": peak_rss_bytes(),
        "peak_cuda_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
        "reference_model_loaded": trainer.ref_model is not None,
        "params": params,
    }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=1, help="processes per case")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per process (1: robust on a shared machine, see docs/benchmarks.md)",
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--engine", default="hf", choices=["hf", "static", "vllm"])
    return parser.parse_args(argv)


def _run_cases(opts: argparse.Namespace, work: Path, ref_per_step: int) -> dict[str, dict]:
    """Every method, ``opts.repeats`` times, each run in its own process."""
    from benchmarks.common import run_child, summary

    results: dict[str, dict] = {}
    for repeat in range(opts.repeats):
        for name, extra in CASES.items():
            overrides = base_overrides(work, opts) + [
                e.format(ref_per_step=ref_per_step) for e in extra
            ]
            out = run_child(
                "benchmarks.step_time",
                {"overrides": overrides, "steps": opts.steps, "threads": opts.threads},
            )
            agg = results.setdefault(
                name, {"step_times": [], "cpu_step_times": [], "peak_bytes": [], "raw": []}
            )
            agg["step_times"] += out["step_times"]
            agg["cpu_step_times"] += out["cpu_step_times"]
            # on a GPU the figure that matters is CUDA memory, on a CPU the process RSS
            agg["peak_bytes"].append(out["peak_cuda_bytes"] or out["peak_rss_bytes"])
            agg["raw"].append(out)
            print(f"[{repeat}] {name}: {summary(out['step_times'])}", file=sys.stderr, flush=True)
    return results


def _ratios(results: dict[str, dict]) -> dict[str, float]:
    """The goals' ratios: DPH-JS / GRPO + reverse KL time, Lp-Reg / GRPO time and memory."""
    from benchmarks.common import summary

    def med(name: str) -> float:
        return summary(results[name]["step_times"])["median"]

    def mem(name: str) -> float:
        return max(results[name]["peak_bytes"])

    def cpu(name: str) -> float:
        return summary(results[name]["cpu_step_times"])["median"]

    return {
        "dph_js_vs_grpo_rkl": med("dph_js") / med("grpo_rkl"),
        "dph_js_vs_grpo_rkl_cpu": cpu("dph_js") / cpu("grpo_rkl"),
        "lp_reg_vs_grpo_cpu": cpu("lp_reg") / cpu("grpo"),
        "lp_reg_vs_grpo_time": med("lp_reg") / med("grpo"),
        "lp_reg_vs_grpo_memory": mem("lp_reg") / mem("grpo"),
    }


def _table(results: dict[str, dict], ratios: dict[str, float]) -> str:
    from benchmarks.common import markdown_table, spread, summary

    rows = [
        [
            name,
            spread(summary(results[name]["step_times"])),
            spread(summary(results[name]["cpu_step_times"])),
            f"{max(results[name]['peak_bytes']) / 2**20:.0f}",
            str(results[name]["raw"][0]["reference_model_loaded"]),
        ]
        for name in CASES
    ]
    dph = ratios["dph_js_vs_grpo_rkl"]
    lp_time, lp_mem = ratios["lp_reg_vs_grpo_time"], ratios["lp_reg_vs_grpo_memory"]
    dph_noref = not any(r["reference_model_loaded"] for r in results["dph_js"]["raw"])
    goals = [
        [
            "dph_js / grpo_rkl time",
            f"{dph:.3f}x",
            "<= 0.85x, no reference model",
            "met" if dph <= 0.85 and dph_noref else "not met",
        ],
        ["lp_reg / grpo time", f"{lp_time:.3f}x", "<= 1.05x", _met(lp_time <= 1.05)],
        ["lp_reg / grpo peak memory", f"{lp_mem:.3f}x", "<= 1.05x", _met(lp_mem <= 1.05)],
    ]
    headers = ["method", "step time s (median [min, max])", "CPU s per step"]
    headers += ["peak memory MiB (CUDA if any, else RSS)", "reference model"]
    table = markdown_table(headers, rows)
    return table + "\n" + markdown_table(["ratio", "measured", "goal", "status"], goals)


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import summary, write_results

    opts = _parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="divrl-bench-step-"))
    prepare(work, opts)
    ref_per_step = max(1, opts.prompts * opts.n // 8)
    results = _run_cases(opts, work, ref_per_step)
    ratios = _ratios(results)
    payload = {
        "settings": {k: v for k, v in vars(opts).items()},
        "ref_per_step": ref_per_step,
        "results": {k: {**v, "summary": summary(v["step_times"])} for k, v in results.items()},
        "ratios": ratios,
    }
    write_results("step_time", payload, _table(results, ratios))
    return 0


if __name__ == "__main__":
    from benchmarks.common import entry_point

    entry_point(main, child)
