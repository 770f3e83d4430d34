"""Report figures (matplotlib, Agg backend): each PNG has a title, labelled axes and a legend.

Every function takes plain data (dicts of numbers) and a path, writes one PNG and returns
the path; nothing here reads run directories.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "plot_pass_at_k",
    "plot_spark_words",
    "plot_style_histogram",
    "plot_training_curves",
]

_DPI = 110


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _grid(n: int) -> tuple[int, int]:
    cols = min(n, 3)
    return math.ceil(n / cols), cols


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def plot_pass_at_k(
    curves: Mapping[str, Mapping[str, Mapping[int, float]]],
    path: str | Path,
    *,
    relative_to: str | None = None,
    intervals: Mapping[str, Mapping[str, Mapping[int, tuple[float, float]]]] | None = None,
    title: str,
) -> Path:
    """Pass@k against k, one panel per eval set, one line per model.

    Args:
        curves: ``{eval set: {model: {k: Pass@k}}}``.
        relative_to: draw ``Pass@k(model) / Pass@k(relative_to)`` instead (that model is
            then the dashed line at 1), as in the DPH paper's Figure 1.
        intervals: optional ``{eval set: {model: {k: (low, high)}}}`` shaded around lines.
    """
    plt = _pyplot()
    rows, cols = _grid(len(curves))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.7 * rows), squeeze=False)
    for ax, (split, models) in zip(axes.flat, curves.items(), strict=False):
        base = models.get(relative_to) if relative_to else None
        for name, values in models.items():
            if relative_to and name == relative_to:
                continue
            ks = sorted(values)
            y = np.array([values[k] for k in ks])
            if base is not None:
                den = np.array([base.get(k, math.nan) for k in ks])
                y = np.divide(y, den, out=np.full_like(y, math.nan), where=den > 0)
            if np.isnan(y).all():
                continue  # undefined ratio (base Pass@k = 0 at every k)
            (line,) = ax.plot(ks, y, marker="o", ms=3.5, label=name)
            band = (intervals or {}).get(split, {}).get(name)
            if band and base is None:
                lo = [band[k][0] for k in ks]
                hi = [band[k][1] for k in ks]
                ax.fill_between(ks, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
        if relative_to:
            ax.axhline(1.0, color="k", ls="--", lw=1, label=f"{relative_to} (= 1)")
            ax.set_ylabel(f"Pass@k / Pass@k of {relative_to}")
        else:
            ax.set_ylabel("Pass@k (share of prompts)")
            ax.set_ylim(-0.02, 1.02)
        all_ks = sorted({k for v in models.values() for k in v})
        ax.set_xlim(min(all_ks) / 1.2, max(all_ks) * 1.2)
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_ks, [str(k) for k in all_ks])
        ax.set_xlabel("k (samples per prompt)")
        if len(curves) > 1:
            ax.set_title(split)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(curves) :]:
        ax.set_visible(False)
    shaded = intervals is not None and relative_to is None
    fig.suptitle(title + ("\n(shaded: bootstrap confidence interval)" if shaded else ""))
    fig.tight_layout()
    return _save(fig, path)


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or y.size < window:
        return y
    kernel = np.ones(window) / window
    valid = np.convolve(np.nan_to_num(y), kernel, mode="valid")
    return np.concatenate([np.full(window - 1, np.nan), valid])


def plot_training_curves(
    runs: Mapping[str, Sequence[Mapping[str, float]]],
    panels: Sequence[tuple[str, Sequence[str], str]],
    path: str | Path,
    *,
    title: str,
) -> Path:
    """Training metrics against step: one panel per quantity, one line per run.

    Args:
        runs: ``{run: [metrics record with 'step', ...]}`` (the trainer's metrics.jsonl).
        panels: ``(panel title, metric keys tried in order, y-axis label)``; a run is drawn
            with the first key it logged (the key is named in the legend when it is not the
            panel's first).
    """
    plt = _pyplot()
    rows, cols = _grid(len(panels))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    longest = max((len(r) for r in runs.values()), default=1)
    window = max(1, longest // 15)
    for ax, (panel_title, keys, ylabel) in zip(axes.flat, panels, strict=False):
        drawn = 0
        for name, records in runs.items():
            key = next((k for k in keys if any(k in r for r in records)), None)
            if key is None:
                continue
            steps = np.array([r["step"] for r in records if key in r], dtype=float)
            y = np.array([r[key] for r in records if key in r], dtype=float)
            label = name if key == keys[0] else f"{name} ({key})"
            (line,) = ax.plot(steps, y, lw=0.6, alpha=0.35)
            ax.plot(steps, _smooth(y, window), lw=1.8, color=line.get_color(), label=label)
            drawn += 1
        ax.set_title(panel_title)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    smooth_note = f" (thick: rolling mean over {window} steps)" if window > 1 else ""
    fig.suptitle(title + smooth_note)
    fig.tight_layout()
    return _save(fig, path)


def plot_style_histogram(
    counts: Mapping[str, Mapping[str, int]], path: str | Path, *, title: str
) -> Path:
    """Share of samples per solution style, grouped bars, one group per style.

    Args:
        counts: ``{model: {style: number of samples}}``.
    """
    plt = _pyplot()
    totals = {m: sum(c.values()) for m, c in counts.items()}
    styles = sorted(
        {s for c in counts.values() for s in c},
        key=lambda s: -sum(c.get(s, 0) / max(totals[m], 1) for m, c in counts.items()),
    )
    width = 0.8 / max(len(counts), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(styles) + 2), 4.2))
    x = np.arange(len(styles))
    for i, (model, c) in enumerate(counts.items()):
        shares = [c.get(s, 0) / max(totals[model], 1) for s in styles]
        ax.bar(x + (i - (len(counts) - 1) / 2) * width, shares, width, label=model)
    ax.set_xticks(x, styles, rotation=30, ha="right")
    ax.set_ylabel("share of samples")
    ax.set_xlabel("solution style")
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def plot_spark_words(
    curves: Mapping[str, Sequence[Mapping[str, float]]],
    words: Sequence[str],
    path: str | Path,
    *,
    title: str,
) -> Path:
    """Spark-word probability against checkpoint step: one panel per word, line per run.

    Args:
        curves: ``{run: [{"step": s, word: probability, ...}]}``.
    """
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    rows, cols = _grid(len(words))
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.3 * rows), squeeze=False)
    for ax, word in zip(axes.flat, words, strict=False):
        for name, points in curves.items():
            steps = [p["step"] for p in points]
            ax.plot(steps, [p[word] for p in points], marker="o", ms=3.5, label=name)
        ax.set_title(f"word {word!r}")
        ax.set_xlabel("training step (checkpoint)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("mean P(word starts here)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(words) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)
