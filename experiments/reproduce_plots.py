"""The reproduction report's plots: entropy over training, Pass@k over k per split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.reproduce_report import METHODS, SPLITS, report_splits, stat


def _line_style(method: str) -> dict[str, Any]:
    """A fixed colour per method (tab20: the 10 dark shades first, then the light ones), so
    13 methods get 13 colours and a method keeps its colour in every plot."""
    import matplotlib

    i = list(METHODS).index(method) if method in METHODS else len(METHODS)
    color = matplotlib.colormaps["tab20"]((2 * i) % 20 + (2 * i) // 20 % 2)
    return {"color": color, "ls": "--" if method == "base" else "-"}


def plot_entropy(groups: dict[str, list[dict[str, Any]]], path: Path) -> Path | None:
    """Mean policy entropy over training per method (shaded: min-max over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for method, runs in groups.items():
        curves = [
            (r["training"]["step"], r["training"]["entropy"]) for r in runs if r.get("training")
        ]
        # a run that logged no entropy (None at its steps) has no curve to draw
        curves = [(s, e) for s, e in curves if s and None not in e]
        if not curves:
            continue
        steps = curves[0][0]
        same = [e for s, e in curves if s == steps]
        mean = [sum(col) / len(col) for col in zip(*same, strict=True)]
        style = _line_style(method)
        ax.plot(steps, mean, label=METHODS.get(method, method), **style)
        if len(same) > 1:
            ax.fill_between(
                steps, [min(c) for c in zip(*same, strict=True)],
                [max(c) for c in zip(*same, strict=True)], alpha=0.12, color=style["color"],
            )  # fmt: skip
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("training step")
    ax.set_ylabel("policy entropy (nats/token, actor/entropy)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_pass_at_k(groups: dict[str, list[dict[str, Any]]], path: Path) -> Path | None:
    """Mean Pass@k over seeds against k, one panel per split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = report_splits(groups)
    if not splits:
        return None
    fig, axes = plt.subplots(1, len(splits), figsize=(5 * len(splits), 4), squeeze=False)
    for ax, split in zip(axes[0], splits, strict=True):
        for method, runs in groups.items():
            evs = [r["eval"][split] for r in runs if split in r["eval"]]
            if not evs:
                continue
            ks = sorted(set.intersection(*({int(k) for k in e["pass@k"]} for e in evs)))
            ys = [stat(e["pass@k"][str(k)] for e in evs).mean for k in ks]
            ax.plot(ks, ys, marker="o", ms=3, label=METHODS.get(method, method),
                    **_line_style(method))  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_title(SPLITS.get(split, split))
        ax.set_xlabel("k")
        ax.set_ylabel("Pass@k (mean over seeds)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- Markdown
