"""Per-token log-prob + entropy + min-p normaliser at a realistic vocabulary: chunked vs naive.

Each case runs in its own process (peak RSS belongs to it alone): bf16 logits
``[length, 152064]`` as a model's LM head would give them, forward and backward of
``sum(log_prob) + sum(entropy)`` plus the (no-grad) Lp-Reg normaliser.

- naive: ``logits.float()``, ``log_softmax``, gather, ``-(p * log p).sum``, and the min-p
  normaliser from a full ``softmax`` (what a straightforward implementation writes);
- chunked: :func:`divrl.algorithms.logit_stats` with ``chunk_size`` positions per chunk,
  recomputed in backward.

Goal: chunked peak memory <= 1/4 of naive at equal or better time.

    python -m benchmarks.logits [--lengths 1024 2048 4096 8192] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys

VOCAB = 152_064


def _make_logits(length: int, vocab: int, device: str = "cpu"):
    import torch

    g = torch.Generator().manual_seed(0)
    logits = torch.empty(length, vocab, dtype=torch.bfloat16, device=device)
    for start in range(0, length, 256):  # no full-size fp32 temporary
        rows = logits[start : start + 256]
        rows.copy_(3 * torch.randn(rows.shape, generator=g))
    tokens = torch.randint(0, vocab, (length,), generator=g).to(device)
    return logits.requires_grad_(), tokens


def _naive(logits, tokens, kappa: float = 0.02):
    import torch

    x = logits.float()
    logp = torch.log_softmax(x, -1)
    lp = logp.gather(-1, tokens[:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    with torch.no_grad():
        p = torch.softmax(x, -1)
        keep = p >= kappa * p.amax(-1, keepdim=True)
        log_z = (p * keep).sum(-1).log()
    (lp.sum() + entropy.sum()).backward()
    return log_z


def _chunked(logits, tokens, chunk_size: int, kappa: float = 0.02):
    from divrl.algorithms import logit_stats

    stats = logit_stats(logits, tokens, chunk_size=chunk_size, minp_kappa=kappa)
    (stats.log_prob.sum() + stats.entropy.sum()).backward()
    return stats.log_normalizer


def child(args: dict) -> dict:
    """Runs in the child process: one (method, length) case."""
    import torch

    from benchmarks.common import peak_rss_bytes, rss_bytes, timed

    torch.set_num_threads(args.get("threads", torch.get_num_threads()))
    device = args.get("device", "cpu")
    cuda = device.startswith("cuda")
    logits, tokens = _make_logits(args["length"], args["vocab"], device)
    base = torch.cuda.memory_allocated() if cuda else rss_bytes()
    if cuda:
        torch.cuda.reset_peak_memory_stats()

    def run():
        logits.grad = None
        if args["method"] == "naive":
            _naive(logits, tokens)
        else:
            _chunked(logits, tokens, args["chunk_size"])
        if cuda:
            torch.cuda.synchronize()

    times = timed(run, repeats=args["repeats"], warmup=1)
    peak = torch.cuda.max_memory_allocated() if cuda else peak_rss_bytes()
    return {"times": times, "peak_extra_bytes": peak - base}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--chunk-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--naive-max-gb",
        type=float,
        default=14.0,
        help="skip the naive case when its estimated peak (~5 fp32 copies) exceeds this",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    return parser.parse_args(argv)


def _measure(length: int, opts: argparse.Namespace) -> dict:
    """Both methods at one length, each in its own process (naive skipped over budget)."""
    from benchmarks.common import run_child, summary

    copy_gb = length * opts.vocab * 4 / 2**30
    result = {"length": length, "vocab": opts.vocab, "fp32_copy_gb": copy_gb}
    for method in ("naive", "chunked"):
        if method == "naive" and 5 * copy_gb > opts.naive_max_gb:
            result[method] = {"skipped": f"estimated peak {5 * copy_gb:.1f} GB > budget"}
            continue
        out = run_child(
            "benchmarks.logits",
            {
                "method": method,
                "length": length,
                "vocab": opts.vocab,
                "chunk_size": opts.chunk_size,
                "repeats": opts.repeats,
                "device": opts.device,
            },
        )
        result[method] = {
            "time_s": summary(out["times"]),
            "peak_extra_gb": out["peak_extra_bytes"] / 2**30,
        }
        print(f"length {length} {method}: {result[method]}", file=sys.stderr, flush=True)
    return result


def _row(result: dict) -> list:
    """One table row: times, peaks and their ratios (dashes where naive was skipped)."""
    from benchmarks.common import spread

    naive, chunked = result["naive"], result["chunked"]
    chunked_peak = f"{chunked['peak_extra_gb']:.2f}"
    if "skipped" in naive:
        median = f"{chunked['time_s']['median']:.2f}"
        return [result["length"], "skipped", median, "-", "skipped", chunked_peak, "-", "-"]
    t_ratio = chunked["time_s"]["median"] / naive["time_s"]["median"]
    m_ratio = chunked["peak_extra_gb"] / naive["peak_extra_gb"]
    return [
        result["length"],
        spread(naive["time_s"], 2),
        spread(chunked["time_s"], 2),
        f"{t_ratio:.2f}x",
        f"{naive['peak_extra_gb']:.2f}",
        chunked_peak,
        f"{m_ratio:.3f}x",
        "met" if (m_ratio <= 0.25 and t_ratio <= 1.0) else "not met",
    ]


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import markdown_table, write_results

    opts = _parse_args(argv)
    cases = [_measure(length, opts) for length in opts.lengths]
    table = markdown_table(
        [
            "length",
            "naive time s (median [min, max])",
            "chunked time s",
            "time ratio",
            "naive peak GB",
            "chunked peak GB",
            "memory ratio",
            "goal (mem <= 0.25x, time <= 1x)",
        ],
        [_row(result) for result in cases],
    )
    write_results("logits", {"chunk_size": opts.chunk_size, "cases": cases}, table)
    return 0


if __name__ == "__main__":
    from benchmarks.common import entry_point

    entry_point(main, child)
