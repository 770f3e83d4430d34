"""The cost of the rollout importance-sampling correction (``algorithm.rollout_is``,
:func:`divrl.algorithms.rollout_is_weights`), two ways:

- **in a training step**: the step of ``benchmarks.step_time`` (the same random-init Llama,
  prompts, response lengths and reward; on-policy GRPO, the ``hf`` engine) with
  ``algorithm.rollout_is=token`` and with it off, each in its own process, alternately.
  In the corrected run the CPU time spent in the trainer's ``_rollout_weights`` (the
  weights of every micro-batch) is summed per step: its share of the step's CPU time is
  the correction's cost, read without the step-to-step noise that a difference of two
  step times carries on a shared machine (that difference is reported too);
- **beside the loss it composes with**: the clipped surrogate (``policy_loss``) forward +
  backward on ``[rows, length]`` tensors, alone and with the token-level weights computed
  and passed as ``token_weights``, called alternately; median CPU ms.

CPU time of the process (``time.process_time``) throughout: on a shared machine it moves
much less with the other load than wall-clock does.

    python -m benchmarks.rollout_is [--steps 3] [--repeats 2] [--rows 32] [--length 2048]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import step_time


def child(args: dict) -> dict:
    """One run of ``args["steps"]`` timed steps (after a warm-up step), with the time spent
    in the rollout correction's weights summed per step."""
    from divrl.training import update
    from divrl.training.config import load_config
    from divrl.training.trainer import Trainer

    torch.set_num_threads(args["threads"])
    spent = [0.0]
    real = update.PolicyUpdate._rollout_weights

    def timed_weights(self, *a, **k):
        t0 = time.process_time()
        out = real(self, *a, **k)
        spent[0] += time.process_time() - t0
        return out

    update.PolicyUpdate._rollout_weights = timed_weights
    trainer = Trainer(load_config(None, args["overrides"]), reward_fn=step_time.reward_fn)
    steps, cpu, weights, is_mean = [], [], [], []
    for step in range(args["steps"] + 1):
        spent[0] = 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        metrics = trainer.train_step()
        if step > 0:  # the first step warms up allocators and caches
            steps.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            weights.append(spent[0])
            is_mean.append(metrics.get("rollout/is_weight_mean"))
    return {"step_s": steps, "cpu_s": cpu, "weights_s": weights, "is_weight_mean": is_mean}


def in_step(opts: argparse.Namespace) -> dict:
    """Both runs, ``opts.repeats`` processes each, alternately."""
    from benchmarks.common import run_child

    work = Path(tempfile.mkdtemp(prefix="divrl-bench-is-"))
    step_opts = step_time._parse_args(["--steps", str(opts.steps), "--threads", "1"])
    step_time.prepare(work, step_opts, presample_store=False)
    runs: dict[str, dict[str, list]] = {}
    for _ in range(opts.repeats):
        for level in ("null", "token"):
            overrides = [
                *step_time.base_overrides(work, step_opts),
                f"algorithm.rollout_is={level}",
            ]
            out = run_child(
                "benchmarks.rollout_is", {"overrides": overrides, "steps": opts.steps, "threads": 1}
            )
            agg = runs.setdefault(level, {})
            for key, values in out.items():
                agg.setdefault(key, []).extend(values)
    if any(v is None for v in runs["token"]["is_weight_mean"]):
        raise RuntimeError("the corrected run logged no rollout/is_weight_mean: it was not on")
    return runs


def _loss_call(lp, old, rollout, adv, mask, corrected: bool) -> None:
    from divrl.algorithms import policy_loss, rollout_is_weights

    x = lp.clone().requires_grad_(True)
    weights = rollout_is_weights(old, rollout, mask, "token", 2.0)[0] if corrected else None
    loss, _ = policy_loss(x, old, adv, mask, token_weights=weights)
    loss.backward()


def beside_loss(rows: int, length: int, repeats: int) -> tuple[float, float]:
    """(median CPU seconds of the loss alone, with the correction), called alternately."""
    g = torch.Generator().manual_seed(0)
    old = torch.log(torch.rand(rows, length, generator=g) * 0.99 + 0.01)
    lp = old + 0.05 * torch.randn(rows, length, generator=g)
    rollout = old + 0.1 * torch.randn(rows, length, generator=g)  # a sampler's own kernels
    adv, mask = torch.randn(rows, generator=g), torch.ones(rows, length)
    times: dict[bool, list[float]] = {False: [], True: []}
    for corrected in (False, True):  # warm-up
        _loss_call(lp, old, rollout, adv, mask, corrected)
    for _ in range(repeats):
        for corrected in (False, True):
            t0 = time.process_time()
            _loss_call(lp, old, rollout, adv, mask, corrected)
            times[corrected].append(time.process_time() - t0)
    return statistics.median(times[False]), statistics.median(times[True])


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import markdown_table, write_results

    ap = argparse.ArgumentParser(prog="python -m benchmarks.rollout_is")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per process")
    ap.add_argument("--repeats", type=int, default=2, help="processes per case")
    ap.add_argument("--rows", type=int, default=32, help="rows of the loss case")
    ap.add_argument("--length", type=int, default=2048, help="response tokens per row")
    ap.add_argument("--loss-repeats", type=int, default=20, help="timed loss calls per case")
    opts = ap.parse_args(argv)
    torch.set_num_threads(1)
    runs = in_step(opts)
    med = {level: {k: statistics.median(v) for k, v in r.items() if k != "is_weight_mean"}
           for level, r in runs.items()}  # fmt: skip
    on, off = med["token"], med["null"]
    share = on["weights_s"] / on["cpu_s"]
    loss_off, loss_on = beside_loss(opts.rows, opts.length, opts.loss_repeats)
    rows = [
        ["in a step: weights / step, CPU time", f"{on['weights_s'] * 1e3:.2f} ms",
         f"{on['cpu_s'] * 1e3:.0f} ms", f"{share:.2%}"],
        ["in a step: corrected / plain step CPU time", f"{on['cpu_s'] * 1e3:.0f} ms",
         f"{off['cpu_s'] * 1e3:.0f} ms", f"{on['cpu_s'] / off['cpu_s'] - 1:+.1%}"],
        [f"loss fwd+bwd CPU time, {opts.rows} x {opts.length} tokens: with / without",
         f"{loss_on * 1e3:.2f} ms", f"{loss_off * 1e3:.2f} ms", f"{loss_on / loss_off - 1:+.1%}"],
    ]  # fmt: skip
    table = markdown_table(["case", "measured", "against", "share or overhead"], rows)
    table += f"\nGoal: the correction <= 2% of a step: {'met' if share <= 0.02 else 'not met'}.\n"
    payload = {"args": vars(opts), "runs": runs, "share_of_step": share,
               "loss_s": {"without": loss_off, "with": loss_on}}  # fmt: skip
    write_results("rollout_is", payload, table)
    print(table)
    return 0


if __name__ == "__main__":
    from benchmarks.common import entry_point

    entry_point(main, child)
