"""Rollout throughput of the ``hf`` engine vs plain ``generate`` and the raw forward limit.

Same random-init Llama, same prompts, same number of new tokens (EOS is suppressed so every
response has exactly ``--new-tokens`` tokens):

- ``engine``: :class:`divrl.rollout.HFEngine` (sampling + per-token log-probs + texts);
- ``generate``: ``model.generate(do_sample=True)`` alone, what TRL's ``GRPOTrainer`` runs
  without vLLM (no log-probs, no post-processing);
- ``forward``: one teacher-forced batched forward over the same prompt + response tokens
  per batch, the compute-bound upper limit of token throughput (no sequential decoding).

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
    """The engine needs ids and a decoder only; texts are not the point here."""

    eos_token_id = 2
    pad_token_id = 0

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
    """The three ways of making the same tokens, as no-argument callables to time."""
    from divrl.rollout import HFEngine, SamplingParams

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, opts.vocab, (opts.prompts, opts.prompt_len), generator=g)
    sync = torch.cuda.synchronize if opts.device.startswith("cuda") else (lambda: None)
    total_new = opts.prompts * opts.n * opts.new_tokens
    engine = HFEngine(model, _Tokenizer(), batch_size=opts.prompts)
    params = SamplingParams(n=opts.n, temperature=1.0, max_new_tokens=opts.new_tokens)

    def run_engine():
        out = engine.generate(prompts.tolist(), params)
        assert sum(map(len, out.response_ids)) == total_new, "a response ended early"

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

    return {"engine": run_engine, "generate": run_generate, "forward": run_forward}


def _table(results: dict[str, dict]) -> str:
    from benchmarks.common import markdown_table, spread

    eng, gen, fwd = (results[k]["tokens_per_s"] for k in ("engine", "generate", "forward"))
    rows = [[name, spread(r["time_s"]), f"{r['tokens_per_s']:.0f}"] for name, r in results.items()]
    ratios = [
        [
            "engine / plain generate",
            f"{eng / gen:.3f}x",
            ">= 1x (TRL's CPU path)",
            "met" if eng >= gen else "not met",
        ],
        ["engine / raw forward", f"{eng / fwd:.3f}x", "how close to the compute limit", "-"],
    ]
    table = markdown_table(["method", "time s (median [min, max])", "new tokens/s"], rows)
    return table + "\n" + markdown_table(["ratio", "measured", "goal", "status"], ratios)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import summary, timed, write_results

    opts = _parse_args(argv)
    torch.set_num_threads(opts.threads)
    model = build(opts.hidden, opts.layers, opts.vocab).to(opts.device, getattr(torch, opts.dtype))
    # no EOS: every response is exactly new_tokens long in every method
    model.generation_config.suppress_tokens = [2]
    total_new = opts.prompts * opts.n * opts.new_tokens
    results = {}
    for name, fn in _methods(model, opts).items():
        times = timed(fn, repeats=opts.repeats, warmup=1)
        results[name] = {
            "time_s": summary(times),
            "tokens_per_s": total_new / summary(times)["median"],
        }
        print(f"{name}: {results[name]}", file=sys.stderr, flush=True)
    eng, gen, fwd = (results[k]["tokens_per_s"] for k in ("engine", "generate", "forward"))
    write_results(
        "rollout",
        {
            "settings": vars(opts),
            "results": results,
            "ratios": {"engine_vs_generate": eng / gen, "engine_vs_forward": eng / fwd},
        },
        _table(results),
    )
    return 0


if __name__ == "__main__":
    from benchmarks.common import entry_point

    entry_point(main)
