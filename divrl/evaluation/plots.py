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
    "model_colors",
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
    """(rows, cols) for ``n`` panels, at most 3 columns, the fewest blank cells: one row up
    to 3 panels, then as square as fits (4 panels: 2 x 2, not 2 x 3 with two blanks)."""
    cols = n if n <= 3 else min(3, math.ceil(math.sqrt(n)))
    return math.ceil(n / cols), cols


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def model_colors(names: Sequence[str]) -> dict[str, str]:
    """One fixed colour per model, by its position in ``names`` (matplotlib's tab10, then
    tab20's lighter shades): pass the same mapping to every plot of a report."""
    from matplotlib import colormaps

    palette = [colormaps["tab10"](i) for i in range(10)]
    palette += [colormaps["tab20"](2 * i + 1) for i in range(10)]
    from matplotlib.colors import to_hex

    return {name: to_hex(palette[i % len(palette)]) for i, name in enumerate(names)}


def _color(colors: Mapping[str, str] | None, name: str) -> str | None:
    return None if colors is None else colors.get(name)


def _zoom(
    ax, lows: list[float], highs: list[float], floor: float | None, ceiling: float | None
) -> None:
    """Y limits around the drawn values (lines and bands) with a 10% margin, kept within
    ``[floor, ceiling]`` (a Pass@k axis never shows values a share cannot take)."""
    values = [v for v in lows + highs if v is not None and math.isfinite(v)]
    if not values:
        return
    lo, hi = min(values), max(values)
    pad = max((hi - lo) * 0.1, 0.01)
    bottom = lo - pad if floor is None else max(floor, lo - pad)
    top = hi + pad if ceiling is None else min(ceiling, hi + pad)
    ax.set_ylim(bottom, top)


def _k_axis(ax, all_ks: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlim(min(all_ks) / 1.2, max(all_ks) * 1.2)
    ax.set_xticks(all_ks, [str(k) for k in all_ks])
    ax.minorticks_off()
    ax.set_xlabel("k (samples per prompt)")


def plot_pass_at_k(
    curves: Mapping[str, Mapping[str, Mapping[int, float]]],
    path: str | Path,
    *,
    relative_to: str | None = None,
    intervals: Mapping[str, Mapping[str, Mapping[int, tuple[float, float]]]] | None = None,
    colors: Mapping[str, str] | None = None,
    title: str,
) -> Path:
    """Pass@k against k, one panel per eval set, one line per model; the y axis is zoomed to
    the lines and their bands (a fixed 0-1 axis flattens the differences).

    Args:
        curves: ``{eval set: {model: {k: value}}}``: Pass@k, or with ``relative_to`` already
            the ratio to that model (the DPH paper's Figure 1).
        relative_to: the values are ratios to this model, drawn as the dashed line at 1.
        intervals: optional ``{eval set: {model: {k: (low, high)}}}`` shaded around lines
            (bootstrap intervals; for ratios the paired interval).
        colors: ``{model: colour}`` (:func:`model_colors`), the same in every plot.
    """
    plt = _pyplot()
    rows, cols = _grid(len(curves))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.7 * rows), squeeze=False)
    for ax, (split, models) in zip(axes.flat, curves.items(), strict=False):
        lows: list[float] = [1.0] if relative_to else []
        highs: list[float] = [1.0] if relative_to else []
        for name, values in models.items():
            ks = sorted(k for k in values if values[k] is not None and math.isfinite(values[k]))
            if not ks or (relative_to and name == relative_to):
                continue
            y = [values[k] for k in ks]
            ax.plot(ks, y, marker="o", ms=3.5, label=name, color=_color(colors, name))
            lows += y
            highs += y
            band = (intervals or {}).get(split, {}).get(name)
            if band and all(k in band for k in ks):
                lo, hi = [band[k][0] for k in ks], [band[k][1] for k in ks]
                color = _color(colors, name) or ax.get_lines()[-1].get_color()
                ax.fill_between(ks, lo, hi, color=color, alpha=0.1, lw=0)
                for edge in (lo, hi):  # thin edges keep overlapping bands apart
                    ax.plot(ks, edge, color=color, lw=0.6, alpha=0.5, ls=":")
                lows += lo
                highs += hi
        if relative_to:
            base_color = _color(colors, relative_to) or "k"
            ax.axhline(1.0, color=base_color, ls="--", lw=1.2, label=f"{relative_to} (= 1)")
            ax.set_ylabel(f"Pass@k / Pass@k of {relative_to}")
            _zoom(ax, lows, highs, floor=0.0, ceiling=None)
        else:
            ax.set_ylabel("Pass@k (share of prompts)")
            _zoom(ax, lows, highs, floor=-0.01, ceiling=1.01)
        _k_axis(ax, sorted({k for v in models.values() for k in v}))
        if len(curves) > 1:
            ax.set_title(split)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(curves) :]:
        ax.set_visible(False)
    if intervals is not None:
        kind = "paired bootstrap" if relative_to else "bootstrap"
        title += f"\n(shaded: {kind} confidence interval over prompts)"
    fig.suptitle(title)
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
    colors: Mapping[str, str] | None = None,
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
    from matplotlib.ticker import MaxNLocator

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
            (line,) = ax.plot(steps, y, lw=0.6, alpha=0.35, color=_color(colors, name))
            ax.plot(steps, _smooth(y, window), lw=1.8, color=line.get_color(), label=label)
            drawn += 1
        ax.set_title(panel_title)
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
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


MAX_STYLES = 20


def plot_style_histogram(
    counts: Mapping[str, Mapping[str, int]],
    path: str | Path,
    *,
    colors: Mapping[str, str] | None = None,
    title: str,
) -> Path:
    """Share of samples per solution style: horizontal grouped bars, one group per style.

    Styles are rows (long style names stay readable), most common first; past
    :data:`MAX_STYLES` the rest are summed into one "other styles" row.

    Args:
        counts: ``{model: {style: number of samples}}``.
        colors: ``{model: colour}`` (:func:`model_colors`).
    """
    plt = _pyplot()
    totals = {m: max(sum(c.values()), 1) for m, c in counts.items()}
    share = {m: {s: n / totals[m] for s, n in c.items()} for m, c in counts.items()}
    styles = sorted(
        {s for c in counts.values() for s in c},
        key=lambda s: (-sum(sh.get(s, 0.0) for sh in share.values()), s),
    )
    if len(styles) > MAX_STYLES:
        rest = set(styles[MAX_STYLES - 1 :])
        styles = [*styles[: MAX_STYLES - 1], f"other styles ({len(rest)})"]
        for sh in share.values():
            sh[styles[-1]] = sum(v for s, v in sh.items() if s in rest)
    n_models = max(len(counts), 1)
    height = 0.8 / n_models
    label_chars = max((len(s) for s in styles), default=10)
    fig, ax = plt.subplots(
        figsize=(6.5 + min(label_chars, 60) * 0.07, 1.3 + len(styles) * (0.1 + 0.07 * n_models))
    )
    y = np.arange(len(styles))
    for i, model in enumerate(counts):
        values = [share[model].get(s, 0.0) for s in styles]
        offset = (i - (n_models - 1) / 2) * height
        ax.barh(y + offset, values, height, label=model, color=_color(colors, model))
    ax.set_yticks(y, styles, fontsize=8)
    ax.invert_yaxis()  # most common style on top
    ax.set_xlabel("share of samples")
    ax.set_ylabel("solution style")
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return _save(fig, path)


def plot_spark_words(
    curves: Mapping[str, Sequence[Mapping[str, float]]],
    words: Sequence[str],
    path: str | Path,
    *,
    colors: Mapping[str, str] | None = None,
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
            ax.plot(
                steps,
                [p[word] for p in points],
                marker="o",
                ms=3.5,
                label=name,
                color=_color(colors, name),
            )
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
