"""Rollout throughput of the ``static`` and ``hf`` engines vs plain ``generate`` and the raw
forward limit.

Same random-init Llama, same prompts, same number of new tokens (no response ends early:
the engines' EOS id is one the model cannot emit, ``generate`` suppresses its EOS):

- ``static``: :class:`divrl.rollout.static.StaticCacheEngine` (divrl's decode loop:
  sampling + per-token log-probs + texts);
- ``engine``: :class:`divrl.rollout.HFEngine` (``generate`` + log-probs + texts);
- ``generate``: ``model.generate(do_sample=True)`` alone, what TRL's ``GRPOTrainer`` runs
  without vLLM (no log-probs, no post-processing);
- ``forward``: one teacher-forced batched forward over the same prompt + response tokens
  per batch, the compute-bound upper limit of token throughput (no sequential decoding).

The methods take turns, one run each per round (a change in the machine's load hits all of
them alike), and each run's CPU time (``time.process_time``) is recorded besides its
wall-clock: on a shared machine the CPU time moves much less with the other load.

    python -m benchmarks.rollout [--prompts 16] [--n 8] [--new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch


def build(hidden: int, layers: int, vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


class _Tokenizer:
    """The engines need ids and a decoder only; texts are not the point here. The EOS id is
    past the vocabulary, so that no response ends early."""

    pad_token_id = 0

    def __init__(self, eos_token_id: int = 2) -> None:
        self.eos_token_id = eos_token_id

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))

    def batch_decode(self, rows, skip_special_tokens=True):
        return [self.decode(r) for r in rows]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    return parser.parse_args(argv)


def _methods(model, opts: argparse.Namespace) -> dict[str, Callable[[], None]]:
    """The ways of making the same tokens, as no-argument callables to time."""
    from divrl.rollout import HFEngine, SamplingParams
    from divrl.rollout.static import StaticCacheEngine

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, opts.vocab, (opts.prompts, opts.prompt_len), generator=g)
    sync = torch.cuda.synchronize if opts.device.startswith("cuda") else (lambda: None)
    total_new = opts.prompts * opts.n * opts.new_tokens
    tokenizer = _Tokenizer(eos_token_id=opts.vocab)
    engines = {
        "static": StaticCacheEngine(model, tokenizer, batch_size=opts.prompts),
        "engine": HFEngine(model, tokenizer, batch_size=opts.prompts),
    }
    params = SamplingParams(n=opts.n, temperature=1.0, max_new_tokens=opts.new_tokens)

    def runner(engine):
        def run():
            out = engine.generate(prompts.tolist(), params)
            assert sum(map(len, out.response_ids)) == total_new, "a response ended early"

        return run

    @torch.no_grad()
    def run_generate():
        model.generate(
            input_ids=prompts.to(opts.device),
            attention_mask=torch.ones_like(prompts).to(opts.device),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=opts.new_tokens,
            min_new_tokens=opts.new_tokens,
            num_return_sequences=opts.n,
            pad_token_id=0,
        )
        sync()

    full = torch.randint(
        3, opts.vocab, (opts.prompts * opts.n, opts.prompt_len + opts.new_tokens), generator=g
    )

    @torch.no_grad()
    def run_forward():
        model(input_ids=full.to(opts.device), use_cache=False)
        sync()

    return {
        "static": runner(engines["static"]),
        "engine": runner(engines["engine"]),
        "generate": run_generate,
        "forward": run_forward,
    }


# (ratio name, numerator, denominator, goal, threshold or None)
RATIOS = [
    ("static / raw forward", "static", "forward", ">= 0.8x", 0.8),
    ("static / plain generate", "static", "generate", ">= 1.5x", 1.5),
    ("static / hf engine", "static", "engine", "-", None),
    ("hf engine / plain generate", "engine", "generate", ">= 1x (TRL's CPU path)", 1.0),
    ("hf engine / raw forward", "engine", "forward", "-", None),
]


def _ratios(results: dict[str, dict], key: str) -> dict[str, float]:
    """Throughput ratios (time of the denominator / time of the numerator) by ``key``."""
    return {
        name: results[den][key]["median"] / results[num][key]["median"]
        for name, num, den, _, _ in RATIOS
    }


def _table(results: dict[str, dict]) -> str:
    from benchmarks.common import markdown_table, spread

    rows = [
        [name, spread(r["time_s"]), spread(r["cpu_s"]), f"{r['tokens_per_s']:.0f}"]
        for name, r in results.items()
    ]
    wall, cpu = _ratios(results, "time_s"), _ratios(results, "cpu_s")
    ratios = [
        [
            name, f"{wall[name]:.3f}x", f"{cpu[name]:.3f}x", goal,
            "-" if bar is None else ("met" if min(wall[name], cpu[name]) >= bar else "not met"),
        ]
        for name, _, _, goal, bar in RATIOS
    ]  # fmt: skip
    headers = ["method", "wall s (median [min, max])", "CPU s", "new tokens/s (wall)"]
    table = markdown_table(headers, rows)
    headers = ["ratio (throughput)", "wall", "CPU", "goal", "status (both)"]
    return table + "\n" + markdown_table(headers, ratios)


def _rounds(methods: dict, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Wall and CPU seconds of each method, the methods taking turns round by round (after
    one warm-up round)."""
    import time

    times = {name: {"wall": [], "cpu": []} for name in methods}
    for round_ in range(repeats + 1):
        for name, fn in methods.items():
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            if round_:
                times[name]["wall"].append(time.perf_counter() - wall)
                times[name]["cpu"].append(time.process_time() - cpu)
    return times


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import summary, write_results

    opts = _parse_args(argv)
    torch.set_num_threads(opts.threads)
    model = build(opts.hidden, opts.layers, opts.vocab).to(opts.device, getattr(torch, opts.dtype))
    # no EOS in plain generate: every response is exactly new_tokens long in every method
    model.generation_config.suppress_tokens = [2]
    total_new = opts.prompts * opts.n * opts.new_tokens
    results = {}
    for name, t in _rounds(_methods(model, opts), opts.repeats).items():
        results[name] = {
            "time_s": summary(t["wall"]),
            "cpu_s": summary(t["cpu"]),
            "tokens_per_s": total_new / summary(t["wall"])["median"],
        }
        print(f"{name}: {results[name]}", file=sys.stderr, flush=True)
    write_results(
        "rollout",
        {
            "settings": vars(opts),
            "results": results,
            "ratios_wall": _ratios(results, "time_s"),
            "ratios_cpu": _ratios(results, "cpu_s"),
        },
        _table(results),
    )
    return 0


if __name__ == "__main__":
    from benchmarks.common import entry_point

    entry_point(main)
