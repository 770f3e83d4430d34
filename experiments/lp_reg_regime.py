"""Lp-Reg's regime map: where its pull on a low-probability token beats the advantage's push.

A one-decision bandit trained with divrl's own losses. At the decision point the policy
chooses among a *spark* (probability 0.06 at the start; reward 0 during training, its
pay-off comes later), a *competitor* and a *tail* of ``TAIL`` noise tokens. The tail's total
mass is held at ``1 - Z`` by construction (its logits follow the head's log-sum-exp), so
the min-p proxy's kept mass at the decision point is ``Z`` while the spark stays above
``kappa * p_max`` (every tail token sits below it). The competitor and the tail pay
``Bernoulli(q)``, ``q = P / (1 - 0.06)``, so the group pass rate is ``P`` (drifting up to
``q`` as the spark vanishes). Each response is the decision token and ``FILLER`` certain
tokens (probability 0.995, ``Z = 1``) that share its advantage, so the authors' selection
(the ``rho = 0.01`` lowest-probability negative tokens, ``min_k = 2``) sees a population
of the size and makeup it sees in a trace: a few low-probability decision tokens among
many certain ones.

Trained parameters: the spark's and the competitor's logits (SGD, token-mean over the
batch). Methods: ``grpo`` (divrl's clipped surrogate, the Lp-Reg presets' clip range),
``lp_authors`` (:func:`divrl.algorithms.lp_reg_loss` with the authors' selection),
``lp_oracle`` (the same loss with ``selected=`` the negative spark tokens only: the
positive control). Modes: ``on`` (one update per rollout, ``r = 1``, proxy from the current
forward) and ``off`` (``OFF_UPDATES`` updates per rollout on the same batch, ``old`` and the
proxy frozen at the rollout policy's).

Usage (from the repository root)::

    python -m experiments.lp_reg_regime predict            # the predictions table
    python -m experiments.lp_reg_regime run --out /tmp/lp_regime --workers 2
    python -m experiments.lp_reg_regime report --out /tmp/lp_regime [--plot map.png]

``run`` writes one JSON per cell (5 seeds) atomically and skips cells already written.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from divrl.algorithms import (
    group_advantages,
    lp_reg_loss,
    minp_log_normalizer,
    policy_loss,
    proxy_log_prob_rows,
)
from divrl.fileio import atomic_write_text

GROUPS, GROUP_SIZE = 32, 8
FILLER = 20  # certain tokens per response after the decision point
FILLER_PROB = 0.995
TAIL = 1000  # noise tokens at the decision point (each below kappa * p_max for Z >= 0.2)
SPARK0 = 0.06  # the spark's probability at the start
KAPPA, RHO, MIN_K = 0.02, 0.01, 2  # the authors' settings (divrl's defaults)
CLIP_LOW, CLIP_HIGH = 1.0, 9.0  # the Lp-Reg presets' clip range, for every method
STEPS = 150  # rollouts
OFF_UPDATES = 4
LR = 40.0  # SGD on the two logits; the token-mean divides by ~5400 tokens
SEEDS = (0, 1, 2, 3, 4)
ZS = (0.9, 0.7, 0.5, 0.35, 0.2)
PASS_RATES = (0.25, 0.5, 0.875)
BETAS = (0.25, 1.0, 4.0)
METHODS = ("grpo", "lp_authors", "lp_oracle")
MODES = ("on", "off")
SPARK, COMPETITOR = 0, 1


@dataclass(frozen=True)
class Cell:
    """One point of the map (``beta`` is 0 for ``grpo``, which has none)."""

    mode: str
    method: str
    z: float
    pass_rate: float
    beta: float
    filler: int = FILLER  # certain tokens per response (the authors' selection's population)

    @property
    def name(self) -> str:
        tail = "" if self.filler == FILLER else f"_f{self.filler}"
        return f"{self.mode}_{self.method}_z{self.z}_p{self.pass_rate}_b{self.beta}{tail}"


def all_cells() -> list[Cell]:
    cells = []
    for mode, z, p in itertools.product(MODES, ZS, PASS_RATES):
        cells.append(Cell(mode, "grpo", z, p, 0.0))
        for method, beta in itertools.product(METHODS[1:], BETAS):
            cells.append(Cell(mode, method, z, p, beta))
    return cells


#: the authors' selection with longer responses (more certain tokens per decision point)
LONG_FILLER = 200


def filler_cells() -> list[Cell]:
    """On-policy, P = 0.5 and 0.875: GRPO and the authors' selection with ``LONG_FILLER``."""
    cells = []
    for z, p in itertools.product(ZS, (0.5, 0.875)):
        cells.append(Cell("on", "grpo", z, p, 0.0, LONG_FILLER))
        cells += [Cell("on", "lp_authors", z, p, b, LONG_FILLER) for b in (1.0, 4.0)]
    return cells


# ----------------------------------------------------------------------------- the world


def world_logits(theta: torch.Tensor, z: float) -> torch.Tensor:
    """``[2 + TAIL]`` logits: spark, competitor, then the tail, whose total mass is ``1 - z``
    whatever ``theta`` is (so it carries no gradient in effect)."""
    head = torch.logsumexp(theta, 0)
    tail = head + math.log((1.0 - z) / (z * TAIL))
    return torch.cat([theta, tail.expand(TAIL)])


def initial_theta(z: float) -> torch.Tensor:
    share = SPARK0 / z  # the spark's share of the head
    return torch.tensor([math.log(share / (1.0 - share)), 0.0])


@dataclass
class Rollout:
    tokens: torch.Tensor  # [N] decision tokens
    adv: torch.Tensor  # [N]
    old: torch.Tensor  # [N, 1 + FILLER] rollout log-probs
    proxy: torch.Tensor  # [N, 1 + FILLER] rollout proxy log-probs
    log_z: torch.Tensor  # [N, 1 + FILLER]


def _with_filler(decision: torch.Tensor, filler: float, count: int) -> torch.Tensor:
    return torch.cat([decision[:, None], torch.full((decision.shape[0], count), filler)], 1)


def rollout(theta: torch.Tensor, cell: Cell, gen: torch.Generator) -> Rollout:
    n = GROUPS * GROUP_SIZE
    with torch.no_grad():
        logits = world_logits(theta, cell.z)
        tokens = torch.multinomial(torch.softmax(logits, 0), n, replacement=True, generator=gen)
        q = cell.pass_rate / (1.0 - SPARK0)
        pays = torch.rand(n, generator=gen) < q
        rewards = (pays & (tokens != SPARK)).float()
        adv = group_advantages(rewards, torch.arange(n) // GROUP_SIZE)
        old = torch.log_softmax(logits, 0)[tokens]
        # one context: the proxy of every token id once, then the sampled ones
        proxy = proxy_log_prob_rows(logits[None], KAPPA)[0][tokens]
        log_z = minp_log_normalizer(logits[None], KAPPA)[0].expand(n)
    filler = math.log(FILLER_PROB)
    return Rollout(
        tokens,
        adv,
        _with_filler(old, filler, cell.filler),
        _with_filler(proxy, filler, cell.filler),
        _with_filler(log_z, 0.0, cell.filler),
    )


def update_loss(theta: torch.Tensor, ro: Rollout, cell: Cell, first: bool):
    """(loss, metrics) of one update on the rollout ``ro``."""
    logits = world_logits(theta, cell.z)
    lp_dec = torch.log_softmax(logits, 0)[ro.tokens]
    lp = _with_filler(lp_dec, math.log(FILLER_PROB), cell.filler)
    mask = torch.ones_like(lp)
    old, proxy, log_z = ro.old, ro.proxy, ro.log_z
    if cell.mode == "on" and first:  # r = 1 and the current forward's proxy (the same here)
        old = lp.detach()
    clip = {"clip_low": CLIP_LOW, "clip_high": CLIP_HIGH, "agg": "token-mean"}
    if cell.method == "grpo":
        return policy_loss(lp, old, ro.adv, mask, **clip)
    selected = None
    if cell.method == "lp_oracle":
        selected = torch.zeros_like(mask, dtype=torch.bool)
        selected[:, 0] = ro.tokens == SPARK
    return lp_reg_loss(
        lp,
        old,
        proxy,
        ro.adv,
        mask,
        rho=RHO,
        beta=cell.beta,
        min_k=MIN_K,
        log_normalizer=log_z,
        selected=selected,
        **clip,
    )


DIAGNOSTICS = (
    "lp_reg/num_regularized",
    "lp_reg/reg_z_mean",
    "lp_reg/reg_abs_adv_mean",
    "lp_reg/net_push_mean",
    "lp_reg/net_up_share",
)


def train(cell: Cell, seed: int, steps: int = STEPS) -> dict:
    """One run: the spark's probability per rollout and the diagnostics' means."""
    gen = torch.Generator().manual_seed(seed)
    theta = initial_theta(cell.z).requires_grad_(True)
    updates = OFF_UPDATES if cell.mode == "off" else 1
    # the token-mean divides by every token: the same step on the decision token for any filler
    lr = LR * (1 + cell.filler) / (1 + FILLER)
    spark, sums = [], dict.fromkeys(DIAGNOSTICS, 0.0)
    spark_reg, acting = 0.0, 0
    last = {"lp_reg/net_push_mean": 0.0, "lp_reg/net_up_share": 0.0, "steps": 0}
    for _ in range(steps):
        spark.append(float(torch.softmax(world_logits(theta.detach(), cell.z), 0)[SPARK]))
        ro = rollout(theta.detach(), cell, gen)
        for u in range(updates):
            theta.grad = None
            loss, metrics = update_loss(theta, ro, cell, first=u == 0)
            loss.backward()
            with torch.no_grad():  # plain SGD, as torch.optim.SGD steps (without its import)
                theta.add_(theta.grad, alpha=-lr)
            if u == 0 and metrics.get("lp_reg/num_regularized", 0.0) > 0:
                acting += 1
                for key in DIAGNOSTICS:
                    sums[key] += metrics[key]
                spark_reg += _spark_regularized(ro, cell)
            if u == updates - 1 > 0 and metrics.get("lp_reg/num_regularized", 0.0) > 0:
                last["steps"] += 1  # the off-policy pull after the earlier updates
                for key in ("lp_reg/net_push_mean", "lp_reg/net_up_share"):
                    last[key] += metrics[key]
    spark.append(float(torch.softmax(world_logits(theta.detach(), cell.z), 0)[SPARK]))
    return {
        "seed": seed,
        "spark": spark,
        # over the rollouts whose first update regularised some token (0 when none did)
        "diagnostics": {k: v / max(acting, 1) for k, v in sums.items()},
        "acting_steps": acting,
        "last_update": {
            k: v / max(last["steps"], 1) if k != "steps" else v for k, v in last.items()
        },
        "spark_regularized_per_step": spark_reg / max(acting, 1),
    }


def _spark_regularized(ro: Rollout, cell: Cell) -> float:
    """Negative spark tokens the authors' selection would regularise (oracle: all of them
    that are below their proxy) in this rollout, at its start."""
    from divrl.algorithms import lp_reg_selection

    if cell.method == "grpo":
        return 0.0
    mask = torch.ones_like(ro.old)
    selected = None
    if cell.method == "lp_oracle":
        selected = torch.zeros_like(mask, dtype=torch.bool)
        selected[:, 0] = ro.tokens == SPARK
    pick = lp_reg_selection(ro.old, ro.proxy, ro.adv, mask, RHO, MIN_K, selected)
    return float((pick.regularized[:, 0] & (ro.tokens == SPARK)).sum())


# ----------------------------------------------------------------------------- predictions


def _spark_advantages(pass_rate: float) -> list[tuple[float, float]]:
    """``(weight, |A|)`` of a failing spark sample by the number ``k`` of its 7 group mates
    that pass (``k ~ Binomial(7, P)``; ``k = 0``: ``A = 0``), divrl's GRPO advantage."""
    g = GROUP_SIZE
    out = []
    for k in range(g):
        w = math.comb(g - 1, k) * pass_rate**k * (1 - pass_rate) ** (g - 1 - k)
        std = math.sqrt(k * (g - k) / (g * (g - 1))) if k else 0.0
        out.append((w, (k / g) / (std + 1e-6) if k else 0.0))
    return out


def predict(z: float, pass_rate: float, beta: float, method: str, filler: int = FILLER) -> dict:
    """The on-policy gradient analysis of the spark's logit at the start (``p_s = 0.06``).

    ``E[d theta_s] ~ p_s (1 - p_s / Z) (E[g_s] - E[A | other])``: ``g_s`` is a spark
    sample's net push on its log-prob (``-|A| + beta (1/Z - 1)`` when regularised, ``-|A|``
    when not, 0 when its group all fail), ``E[A | other] = p_s E|A_s| / (1 - p_s)`` the
    competitor's (and tail's) mean advantage pushing the spark down through the softmax.
    The authors' selection regularises the ``k = floor(rho N_neg)`` lowest-probability
    negative tokens: the tail's negative samples come first (each below the spark), so it
    reaches ``min(max(k - n_tail, 0), n_spark)`` of the negative spark samples (expected
    counts), and the slots left after them go to the competitor's negative samples, whose
    pull (``(1 - q)`` of its samples fail) lowers the spark's drift through the softmax. The off-policy prediction has the same sign: each rollout's updates start at
    ``r = 1``, ``D = -log Z`` (the on-policy push), and the frozen proxy only strengthens
    the pull while the log-prob falls, so it bounds the fall per rollout without turning it.
    """
    ads = _spark_advantages(pass_rate)
    pull = beta * (1.0 / z - 1.0)
    mixed = sum(w for w, a in ads if a > 0)
    abs_a = sum(w * a for w, a in ads)  # E|A_s| (k = 0 counts 0)
    up_share = sum(w for w, a in ads if a > 0 and pull > a) / mixed
    n = GROUPS * GROUP_SIZE
    q = pass_rate / (1 - SPARK0)
    reach_c = 0.0  # the share of the competitor's negative samples regularised too
    if method == "grpo":
        reach = 0.0
    elif method == "lp_oracle":
        reach = 1.0
    else:
        all_fail = (1 - pass_rate) ** GROUP_SIZE
        neg_responses = n * ((1 - pass_rate) - all_fail)
        k = math.floor(RHO * neg_responses * (1 + filler))
        n_tail = n * (1 - z) * (1 - q) * mixed
        n_spark = n * SPARK0 * mixed
        reach = 0.0 if k < MIN_K else min(max(k - n_tail, 0.0), n_spark) / n_spark
        n_comp = n * (z - SPARK0) * (1 - q) * mixed
        reach_c = 0.0 if k < MIN_K else min(max(k - n_tail - n_spark, 0.0), n_comp) / n_comp
    g_s = sum(w * (-a + (reach * pull if a > 0 else 0.0)) for w, a in ads)
    # the competitor's failing samples, when regularised, are pulled up as well
    drift = g_s - SPARK0 * abs_a / (1 - SPARK0) - (1 - q) * mixed * reach_c * pull
    return {
        "z_star": beta / (beta + abs_a / mixed) if beta else 0.0,
        "mean_abs_adv": abs_a / mixed,
        "net_push": -abs_a / mixed + pull,
        "net_up_share": up_share,
        "reach": reach,
        "reach_competitor": reach_c,
        "drift": drift,
        "direction": "up" if drift > 0 else "down",
    }


def predictions_table() -> str:
    lines = [
        "| Z | P | E|A| (spark, k>0) | beta | net push (oracle) | net_up_share | authors' reach"
        " | oracle | authors' |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for z, p, beta in itertools.product(ZS, PASS_RATES, BETAS):
        o, a = predict(z, p, beta, "lp_oracle"), predict(z, p, beta, "lp_authors")
        lines.append(
            f"| {z} | {p} | {o['mean_abs_adv']:.2f} | {beta} | {o['net_push']:+.2f} | "
            f"{o['net_up_share']:.2f} | {a['reach']:.2f} | {o['direction']} | {a['direction']} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- run, report


def run_cell(cell: Cell, out: Path, steps: int = STEPS) -> str:
    """Train the cell's seeds and write ``<out>/<cell>.json`` atomically (skipped if there)."""
    path = out / f"{cell.name}.json"
    if path.exists():
        return f"{cell.name}: done before"
    torch.set_num_threads(1)
    runs = [train(cell, seed, steps) for seed in SEEDS]
    record = {"cell": asdict(cell), "runs": runs, "world": {**world_settings(), "steps": steps}}
    atomic_write_text(path, json.dumps(record) + "\n")
    return f"{cell.name}: written"


def world_settings() -> dict:
    return {
        "groups": GROUPS,
        "group_size": GROUP_SIZE,
        "filler": FILLER,
        "tail": TAIL,
        "spark0": SPARK0,
        "kappa": KAPPA,
        "rho": RHO,
        "min_k": MIN_K,
        "steps": STEPS,
        "off_updates": OFF_UPDATES,
        "lr": LR,
        "clip": [CLIP_LOW, CLIP_HIGH],
    }


def _nice() -> None:
    os.nice(10)
    torch.set_num_threads(1)


def run(out: Path, workers: int, only: list[str] | None, steps: int = STEPS) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cells = [c for c in all_cells() if only is None or c.name in only]
    cells += [c for c in filler_cells() if only is not None and c.name in only]
    # on-policy first, GRPO and the oracle before the authors' selection: a sweep cut short
    # still has the map's boundary, each Lp-Reg cell with its GRPO baseline
    order = {"grpo": 0, "lp_oracle": 1, "lp_authors": 2}
    cells.sort(key=lambda c: (order[c.method] == 2, c.mode != "on", order[c.method], -c.z))
    with ProcessPoolExecutor(workers, initializer=_nice) as pool:
        for line in pool.map(run_cell, cells, itertools.repeat(out), itertools.repeat(steps)):
            print(line, flush=True)


def load(out: Path) -> dict[Cell, list[dict]]:
    found = {}
    for path in sorted(out.glob("*.json")):
        record = json.loads(path.read_text())
        found[Cell(**record["cell"])] = record["runs"]
    return found


#: the map is read at this rollout (runs of 60 or more rollouts compare there)
READ_AT = 60


def _final_log(run_record: dict) -> float:
    """Mean log spark probability over rollouts ``READ_AT - 9 .. READ_AT``."""
    tail = run_record["spark"][READ_AT - 9 : READ_AT + 1]
    return sum(math.log(max(p, 1e-30)) for p in tail) / len(tail)


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def summarise(found: dict[Cell, list[dict]]) -> list[dict]:
    """Per Lp-Reg cell: the spark's trend ``log(p_T / p_0)``, its gap to GRPO's final log
    probability (seed-paired), the diagnostics, and the prediction."""
    rows = []
    for cell, runs in sorted(found.items(), key=lambda kv: kv[0].name):
        if cell.method == "grpo":
            continue
        base = found.get(Cell(cell.mode, "grpo", cell.z, cell.pass_rate, 0.0, cell.filler))
        trend = [_final_log(r) - math.log(SPARK0) for r in runs]
        gap = [_final_log(r) - _final_log(b) for r, b in zip(runs, base or [], strict=False)]
        diag = {k: _mean_sd([r["diagnostics"][k] for r in runs])[0] for k in DIAGNOSTICS}
        pred = predict(cell.z, cell.pass_rate, cell.beta, cell.method, cell.filler)
        rows.append(
            {
                "cell": asdict(cell),
                "trend": _mean_sd(trend),
                "gap_vs_grpo": _mean_sd(gap) if gap else None,
                "grpo_trend": _mean_sd([_final_log(b) - math.log(SPARK0) for b in base])
                if base
                else None,
                "diagnostics": diag,
                "acting_steps": _mean_sd([r["acting_steps"] for r in runs])[0],
                # off-policy: the net push at each rollout's last update (frozen proxy)
                "last_net_push": _mean_sd(
                    [
                        r["last_update"]["lp_reg/net_push_mean"]
                        for r in runs
                        if r["last_update"]["steps"]
                    ]
                    or [math.nan]
                )[0],
                "spark_regularized_per_step": _mean_sd(
                    [r["spark_regularized_per_step"] for r in runs]
                )[0],
                "predicted": pred["direction"],
                "predicted_net_push": pred["net_push"],
                "measured": "up" if _mean_sd(trend)[0] > 0 else "down",
            }
        )
    return rows


def long_tail(cell: dict) -> str:
    filler = cell.get("filler", FILLER)
    return "" if filler == FILLER else f" ({filler} filler)"


def report_table(rows: list[dict]) -> str:
    lines = [
        "| mode | method | Z | P | beta | predicted | measured | log(p_T/p_0) | GRPO's | gap vs"
        " GRPO | net push (pred / logged, off: first -> last update) | net_up_share | steps"
        " acting | reg. spark/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, (t, tsd) = r["cell"], r["trend"]
        g = r["gap_vs_grpo"]
        gt = r["grpo_trend"]
        d = r["diagnostics"]
        lines.append(
            f"| {c['mode']} | {c['method']}{long_tail(c)} | {c['z']} | {c['pass_rate']} | "
            f"{c['beta']} | "
            f"{r['predicted']} | {r['measured']} | {t:+.2f} ± {tsd:.2f} | "
            f"{gt[0]:+.2f} | {g[0]:+.2f} ± {g[1]:.2f} | "
            f"{r['predicted_net_push']:+.2f} / {d['lp_reg/net_push_mean']:+.2f}"
            f"{f' -> {last:+.2f}' if not math.isnan(last := r['last_net_push']) else ''} | "
            f"{d['lp_reg/net_up_share']:.2f} | {r['acting_steps']:.0f} | "
            f"{r['spark_regularized_per_step']:.1f} |"
        )
    agree = sum(r["predicted"] == r["measured"] for r in rows)
    lines.append(f"\nprediction = measurement in {agree} of {len(rows)} cells")
    return "\n".join(lines)


def plot(found: dict[Cell, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(BETAS), figsize=(4 * len(BETAS), 7), sharey=True)
    colours = dict(zip(PASS_RATES, ("tab:blue", "tab:orange", "tab:red"), strict=True))
    styles = {"grpo": ":", "lp_authors": "--", "lp_oracle": "-"}
    for row, mode in enumerate(MODES):
        for col, beta in enumerate(BETAS):
            ax = axes[row][col]
            for p, method in itertools.product(PASS_RATES, METHODS):
                b = 0.0 if method == "grpo" else beta
                pts = [
                    (z, _mean_sd([_final_log(r) - math.log(SPARK0) for r in runs])[0])
                    for z in ZS
                    if (runs := found.get(Cell(mode, method, z, p, b)))
                ]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, ys, styles[method], color=colours[p], marker=".")
                if method == "lp_oracle":
                    ax.axvline(
                        predict(0.5, p, beta, method)["z_star"], color=colours[p], lw=0.8, alpha=0.6
                    )
            ax.axhline(0, color="k", lw=0.5)
            ax.set_title(f"{mode}-policy, beta={beta}")
            ax.set_xlabel("Z at the decision point")
        axes[row][0].set_ylabel(f"log(p_spark at rollout {READ_AT} / 0.06)")
    handles = [plt.Line2D([], [], color=colours[p], label=f"P={p}") for p in PASS_RATES]
    handles += [plt.Line2D([], [], color="k", ls=s, label=m) for m, s in styles.items()]
    axes[0][-1].legend(handles=handles, fontsize=7)
    fig.suptitle("Spark's fate by Z (vertical lines: predicted Z* = beta / (beta + E|A|))")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.lp_reg_regime")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("predict", help="print the predictions table")
    r = sub.add_parser("run", help="train every missing cell (resumable)")
    r.add_argument("--out", type=Path, required=True, help="folder of the cells' JSON files")
    r.add_argument("--workers", type=int, default=2, help="cells trained at a time")
    r.add_argument("--only", nargs="+", default=None, help="these cells only (their names)")
    r.add_argument("--steps", type=int, default=STEPS, help="rollouts per run")
    p = sub.add_parser("report", help="the measured table (and a plot)")
    p.add_argument("--out", type=Path, required=True, help="folder of the cells' JSON files")
    p.add_argument("--plot", type=Path, default=None, help="write the map's plot here (PNG)")
    p.add_argument("--json", type=Path, default=None, help="write the summary rows here")
    args = ap.parse_args(argv)
    if args.cmd == "predict":
        print(predictions_table())
    elif args.cmd == "run":
        run(args.out, args.workers, args.only, args.steps)
    else:
        if not args.out.is_dir():
            print(
                f"error: {args.out} is not a folder of cells; run `run --out` first",
                file=sys.stderr,
            )
            return 2
        found = load(args.out)
        rows = summarise(found)
        print(report_table(rows))
        if args.json:
            atomic_write_text(args.json, json.dumps(rows, indent=1) + "\n")
        if args.plot:
            plot(found, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
