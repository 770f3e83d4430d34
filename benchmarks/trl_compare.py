"""divrl GRPO vs TRL ``GRPOTrainer``: step time and peak memory, same model and settings.

Both run on the same random-init Llama and prompts, fp32, on-policy (one optimiser step
per rollout batch), ``--prompts`` prompts x ``--n`` completions of at most
``--response-len`` tokens, the same cheap reward on the completion text, no KL term, each
in its own process. Step time excludes the first (warm-up) step.

Gradient checkpointing is set the same in both, and both settings are measured by default:
TRL's ``GRPOConfig`` turns it on by default (less activation memory, a second forward in
the backward), divrl's ``model.gradient_checkpointing`` defaults to off.

Goal: divrl at least as fast as TRL.

    python -m benchmarks.trl_compare [--steps 3] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.step_time import base_overrides, prepare


def text_reward(texts: list[str]) -> list[float]:
    return [float(sum(map(ord, t)) % 2) for t in texts]


def run_divrl(args: dict) -> dict:
    import time

    from divrl.training.config import load_config
    from divrl.training.trainer import Trainer

    config = load_config(None, args["overrides"])
    trainer = Trainer(config, reward_fn=lambda items: text_reward([i.solution_str for i in items]))
    times = []
    for step in range(args["steps"] + 1):
        t0 = time.perf_counter()
        trainer.train_step()
        if step:
            times.append(time.perf_counter() - t0)
    return {"step_times": times}


def run_trl(args: dict) -> dict:
    import time

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    work = Path(args["work"])
    tokenizer = AutoTokenizer.from_pretrained(work / "model")
    model = AutoModelForCausalLM.from_pretrained(work / "model", dtype="float32")
    prompts = [json.loads(line)["prompt"] for line in (work / "toy" / "train.jsonl").open()]
    per_step = args["prompts"] * args["n"]
    config = GRPOConfig(
        output_dir=str(work / "trl_out"),
        per_device_train_batch_size=per_step,
        num_generations=args["n"],
        max_completion_length=args["response_len"],
        max_steps=args["steps"] + 1,
        learning_rate=1e-5,
        beta=0.0,
        bf16=False,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        seed=0,
        temperature=1.0,
        top_p=1.0,
        num_iterations=1,
        gradient_accumulation_steps=1,
        gradient_checkpointing=args["gradient_checkpointing"],
        disable_tqdm=True,
    )

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], None

        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.times.append(time.perf_counter() - self.t0)

    timer = Timer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: text_reward(completions),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.train()
    return {"step_times": timer.times[1:]}


def child(args: dict) -> dict:
    import torch

    from benchmarks.common import peak_rss_bytes

    torch.set_num_threads(args["threads"])
    out = run_divrl(args) if args["framework"] == "divrl" else run_trl(args)
    out["peak_rss_bytes"] = peak_rss_bytes()
    return out


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument(
        "--gradient-checkpointing",
        choices=["off", "on", "both"],
        default="both",
        help="gradient checkpointing in both frameworks (TRL's default is on, divrl's off)",
    )
    opts = parser.parse_args(argv)
    opts.micro = opts.prompts * opts.n  # one forward per step in both frameworks
    opts.dtype, opts.engine = "float32", "hf"
    return opts


def _run_cases(opts: argparse.Namespace, work: Path, settings: list[bool]) -> dict[str, dict]:
    """Every (framework, checkpointing) case, ``opts.repeats`` times, each in its own process."""
    from benchmarks.common import run_child, summary

    common = {
        "work": str(work),
        "steps": opts.steps,
        "prompts": opts.prompts,
        "n": opts.n,
        "response_len": opts.response_len,
        "threads": opts.threads,
        "overrides": base_overrides(work, opts),
    }
    results: dict[str, dict] = {}
    for _ in range(opts.repeats):
        for gc in settings:
            for framework in ("divrl", "trl"):
                case = {
                    **common,
                    "framework": framework,
                    "gradient_checkpointing": gc,
                    "overrides": common["overrides"]
                    + [f"model.gradient_checkpointing={str(gc).lower()}"],
                }
                out = run_child("benchmarks.trl_compare", case)
                name = framework + (" + grad. checkpointing" if gc else "")
                agg = results.setdefault(name, {"step_times": [], "peak_rss_bytes": []})
                agg["step_times"] += out["step_times"]
                agg["peak_rss_bytes"].append(out["peak_rss_bytes"])
                print(f"{name}: {summary(out['step_times'])}", file=sys.stderr, flush=True)
    return results


def _table(results: dict[str, dict], settings: list[bool]) -> tuple[str, dict[str, float]]:
    """The Markdown tables and the divrl / TRL time ratio per checkpointing setting."""
    from benchmarks.common import markdown_table, spread, summary

    med = {k: summary(v["step_times"])["median"] for k, v in results.items()}
    mem = {k: max(v["peak_rss_bytes"]) / 2**20 for k, v in results.items()}
    rows = [[k, spread(summary(v["step_times"])), f"{mem[k]:.0f}"] for k, v in results.items()]
    goals, ratios = [], {}
    for gc in settings:
        suffix = " + grad. checkpointing" if gc else ""
        both = ", both with grad. checkpointing" if gc else ""
        ratio = med["divrl" + suffix] / med["trl" + suffix]
        ratios["gc_on" if gc else "gc_off"] = ratio
        goals.append(
            [
                f"divrl / TRL step time{both}",
                f"{ratio:.3f}x",
                "<= 1x",
                "met" if ratio <= 1.0 else "not met",
            ]
        )
        mem_ratio = mem["divrl" + suffix] / mem["trl" + suffix]
        goals.append([f"divrl / TRL peak RSS{both}", f"{mem_ratio:.3f}x", "-", "-"])
    table = markdown_table(["framework", "step time s (median [min, max])", "peak RSS MiB"], rows)
    table += "\n" + markdown_table(["ratio", "measured", "goal", "status"], goals)
    return table, ratios


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import write_results

    opts = _parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="divrl-bench-trl-"))
    prepare(work, opts, presample_store=False)
    settings = {"off": [False], "on": [True], "both": [False, True]}[opts.gradient_checkpointing]
    results = _run_cases(opts, work, settings)
    table, ratios = _table(results, settings)
    write_results(
        "trl_compare",
        {"settings": vars(opts), "results": results, "ratio_divrl_vs_trl": ratios},
        table,
    )
    return 0


if __name__ == "__main__":
    from benchmarks.common import entry_point

    entry_point(main, child)
