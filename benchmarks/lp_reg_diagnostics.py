"""The cost of Lp-Reg's regime diagnostics (``lp_reg_regime_metrics``) inside
:func:`divrl.algorithms.lp_reg_loss`: forward + backward of the loss on ``[rows, length]``
tensors, with the diagnostics and with them switched off, median over repeats.

    python -m benchmarks.lp_reg_diagnostics [--rows 32] [--length 2048] [--repeats 30]

``rho`` 0.01 is the authors' selection (a few tokens regularised); ``rho`` 1 regularises
every negative kept token, the diagnostics' largest input.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from benchmarks.common import timed
from divrl.algorithms import lp_reg as lp_reg_module


def _inputs(rows: int, length: int, device: str):
    g = torch.Generator().manual_seed(0)
    lp = torch.log(torch.rand(rows, length, generator=g) * 0.99 + 0.01)
    log_z = torch.log(torch.rand(rows, length, generator=g) * 0.5 + 0.5)
    adv = torch.randn(rows, generator=g)
    return [t.to(device) for t in (lp, lp - log_z, adv, torch.ones(rows, length), log_z)]


def case(rows: int, length: int, rho: float, repeats: int, device: str):
    """(median seconds without, with the diagnostics; regularised tokens), the two variants
    called alternately so that a shared machine's load drifts on both alike."""
    lp, proxy, adv, mask, log_z = _inputs(rows, length, device)
    real = lp_reg_module.lp_reg_regime_metrics

    def step(diagnostics: bool) -> dict:
        lp_reg_module.lp_reg_regime_metrics = real if diagnostics else (lambda *a, **k: {})
        try:
            x = lp.clone().requires_grad_(True)
            loss, metrics = lp_reg_module.lp_reg_loss(
                x, lp, proxy, adv, mask, rho=rho, log_normalizer=log_z
            )
            loss.backward()
            if device == "cuda":
                torch.cuda.synchronize()
        finally:
            lp_reg_module.lp_reg_regime_metrics = real
        return metrics

    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for diagnostics in (False, True):
            times[diagnostics] += timed(lambda d=diagnostics: step(d), 1, warmup=1)
    regularized = step(True)["lp_reg/num_regularized"]
    return statistics.median(times[False]), statistics.median(times[True]), regularized


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lp_reg_diagnostics")
    ap.add_argument("--rows", type=int, default=32, help="rows of the batch")
    ap.add_argument("--length", type=int, default=2048, help="response tokens per row")
    ap.add_argument("--repeats", type=int, default=30, help="timed calls per case")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args(argv)
    from benchmarks.common import markdown_table, write_results

    torch.set_num_threads(1)
    rows, cases = [], []
    for rho in (0.01, 1.0):
        off, on, n = case(args.rows, args.length, rho, args.repeats, args.device)
        rows.append(
            [rho, f"{n:.0f}", f"{off * 1e3:.2f}", f"{on * 1e3:.2f}", f"{on / off - 1:+.1%}"]
        )
        cases.append({"rho": rho, "regularised": n, "without_s": off, "with_s": on})
    headers = ["rho", "regularised tokens", "without (ms)", "with (ms)", "overhead"]
    write_results(
        "lp_reg_diagnostics", {"args": vars(args), "cases": cases}, markdown_table(headers, rows)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
