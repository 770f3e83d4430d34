"""The extension points of docs/architecture.md ("How to add"), made again from the docs
alone, each in a scratch copy of the tree, counting the library files each edits.

    python scripts/extension_trial.py [--out DIR] [--keep]

For each of a policy loss (REINFORCE without a clip), an advantage estimator (a median
baseline), a divergence (squared Hellinger), a benchmark profile (``####`` answers with
tolerant numbers, as a math rule), a rollout engine (a greedy wrapper of ``hf``) and a toy
world (bit-string parity: the module and presets ``divrl toy new`` writes), the script
copies the tracked files into a fresh folder (a git repository, so that ``git status``
counts what changed), writes the new module, adds the one registration line the docs name,
regenerates the registry tables (``scripts/registry_tables.py``: docs/ pages change by
command, not by hand), runs the commands that prove the addition works (for the world:
``divrl toy presets`` finds its presets as ``divrl toy new`` wrote them, and ``divrl demo``
trains each on it), and prints one Markdown row per addition: library files added and
edited (under ``divrl/``), doc pages the command rewrote, preset files a command wrote
(under ``configs/``), the commands and whether they passed. docs/architecture.md records
a run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HELLINGER = '''
"""The squared Hellinger divergence for DPH-RL."""

import torch

from divrl.algorithms.divergences import register_divergence


@register_divergence("hellinger", "2 x squared Hellinger distance, bounded by 2")
def hellinger():
    def f(log_u: torch.Tensor) -> torch.Tensor:
        # (sqrt(u) - 1)^2: convex, f(1) = 0
        return torch.expm1(0.5 * log_u.float().clamp(-20.0, 20.0)) ** 2

    return f
'''

HASH_RULE = '''
"""A benchmark whose answers end in ``#### <number>``, compared within 1e-6."""

from divrl.rewards.math_reward import MathVerifier, register_math_rule
from divrl.rewards.profiles import register_profile
from divrl.rewards.types import BenchmarkProfile, ScoreResult


@register_math_rule("hash_tolerant", quick_unless="####")
def hash_tolerant(solution_str: str, ground_truth: str) -> ScoreResult:
    tail = solution_str.rpartition("####")[2].strip().rstrip(".")
    try:
        ok = abs(float(tail) - float(ground_truth)) <= 1e-6
    except ValueError:
        return ScoreResult(0.0, None, "no_answer")
    return ScoreResult(float(ok), tail, "correct" if ok else "wrong")


register_profile(
    BenchmarkProfile(
        "hash_bench",
        verifier=MathVerifier(profile="hash_tolerant"),
        equivalence="divrl.evaluation.equivalence:MathEquivalence",
        math_traces=True,
    )
)
'''

GREEDY = '''
"""A greedy engine: the hf engine with temperature 0 whatever the caller asks."""

import dataclasses

from divrl.rollout.hf import HFEngine, HFOptions
from divrl.rollout.registry import register_policy_engine


class GreedyEngine(HFEngine):
    def generate(self, prompt_ids, params, seeds=None):
        return super().generate(prompt_ids, dataclasses.replace(params, temperature=0.0), seeds)


register_policy_engine(
    "greedy", GreedyEngine, options=HFOptions, summary="hf with greedy decoding"
)
'''

REINFORCE = '''
"""REINFORCE with the group baseline: -A * r on every token, no clip."""

from dataclasses import dataclass
from typing import ClassVar

from divrl.algorithms.aggregation import aggregate
from divrl.algorithms.loss_options import LossOptions
from divrl.algorithms.options import option
from divrl.algorithms.policy_loss import register_policy_loss


@dataclass(frozen=True)
class ReinforceOptions(LossOptions):
    LOSS: ClassVar[str] = "reinforce"
    INPUTS: ClassVar[tuple[str, ...]] = ("token_weights",)
    agg: str = option("token-mean", "loss aggregation mode (verl names)")


@register_policy_loss("reinforce", ReinforceOptions)
def reinforce_loss(
    log_prob, old_log_prob, advantages, mask, agg=ReinforceOptions.agg, token_weights=None
):
    ratio = (log_prob - old_log_prob.detach()).clamp(-20, 20).exp()
    loss_mat = -advantages.detach().view(-1, 1) * ratio
    if token_weights is not None:
        loss_mat = loss_mat * token_weights
    loss = aggregate(loss_mat, mask, agg)
    return loss, {"pg/loss": float(loss.detach())}
'''

MEDIAN = '''
"""Each reward minus the median of its group."""

from dataclasses import dataclass
from typing import ClassVar

import torch

from divrl.algorithms.advantages import AdvantageOptions, register_advantage


@dataclass(frozen=True)
class MedianOptions(AdvantageOptions):
    NAME: ClassVar[str] = "median"


@register_advantage("median", MedianOptions)
def median_advantages(rewards, group_ids):
    """Median baseline: each reward minus its group's median."""
    r = rewards.detach().float().reshape(-1)
    ids = list(group_ids.tolist() if torch.is_tensor(group_ids) else group_ids)
    adv = torch.stack([r[i] - r[[j for j, g in enumerate(ids) if g == ids[i]]].median() for i in range(len(ids))])
    return adv, {"adv/mean": float(adv.mean())}
'''


def _copy_tree(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / name.decode()
        if src.is_file():
            (dest / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name.decode())
    git = ["git", "-c", "user.name=trial", "-c", "user.email=trial@example.invalid"]
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=dest, check=True)


def _add_line(path: Path, after: str, line: str) -> None:
    text = path.read_text()
    if after not in text:
        raise SystemExit(f"{path}: the docs' anchor {after!r} is gone; update this script")
    path.write_text(text.replace(after, after + line, 1))


def _changes(tree: Path) -> tuple[list[str], list[str], list[str], list[str]]:
    """(library files added, library files edited, docs/ pages changed, presets added)."""
    out = subprocess.run(
        ["git", "status", "--porcelain", "-uall"], cwd=tree, capture_output=True, text=True
    ).stdout.splitlines()
    added = [ln[3:] for ln in out if ln.startswith("??") and ln[3:].startswith("divrl/")]
    edited = [ln[3:] for ln in out if ln[:2].strip() == "M" and ln[3:].startswith("divrl/")]
    docs = [ln[3:] for ln in out if ln[3:].startswith("docs/")]
    presets = [ln[3:] for ln in out if ln.startswith("??") and ln[3:].startswith("configs/")]
    return added, edited, docs, presets


def _run(tree: Path, command: str, cache: Path) -> bool:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    env["DIVRL_CACHE_DIR"] = str(cache)
    done = subprocess.run(
        command, shell=True, cwd=tree, env=env, capture_output=True, text=True, timeout=1200
    )
    if done.returncode != 0:
        print(f"  FAILED: {command}\n{textwrap.indent(done.stderr[-2000:], '    ')}")
    return done.returncode == 0


def _additions(py: str) -> dict[str, tuple]:
    """name -> (writes(tree), proof commands)."""

    def divergence(t: Path) -> None:
        (t / "divrl/algorithms/hellinger.py").write_text(HELLINGER.lstrip())
        _add_line(
            t / "divrl/algorithms/__init__.py",
            "from divrl.algorithms.aggregation import AGGREGATIONS, aggregate\n",
            "from divrl.algorithms import hellinger  # noqa: F401  (registers hellinger)\n",
        )

    def profile(t: Path) -> None:
        (t / "divrl/rewards/hash_bench.py").write_text(HASH_RULE.lstrip())
        _add_line(
            t / "divrl/rewards/__init__.py",
            "from divrl.rewards import profiles  # noqa: F401  (registers the built-in benchmarks)\n",
            "from divrl.rewards import hash_bench  # noqa: F401  (registers hash_bench)\n",
        )

    def engine(t: Path) -> None:
        (t / "divrl/rollout/greedy.py").write_text(GREEDY.lstrip())
        _add_line(
            t / "divrl/rollout/__init__.py",
            'from divrl.rollout import static as _static  # noqa: F401 - registers "static"\n',
            'from divrl.rollout import greedy as _greedy  # noqa: F401 - registers "greedy"\n',
        )

    def loss(t: Path) -> None:
        (t / "divrl/algorithms/reinforce.py").write_text(REINFORCE.lstrip())
        _add_line(
            t / "divrl/algorithms/__init__.py",
            "from divrl.algorithms.aggregation import AGGREGATIONS, aggregate\n",
            "from divrl.algorithms import reinforce  # noqa: F401  (registers reinforce)\n",
        )

    def estimator(t: Path) -> None:
        (t / "divrl/algorithms/median_advantage.py").write_text(MEDIAN.lstrip())
        _add_line(
            t / "divrl/algorithms/__init__.py",
            "from divrl.algorithms.aggregation import AGGREGATIONS, aggregate\n",
            "from divrl.algorithms import median_advantage  # noqa: F401  (registers median)\n",
        )

    def world(t: Path) -> None:
        # the scaffold command writes the module and its presets and prints the WORLDS line
        env = {**os.environ, "PYTHONPATH": str(t), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [py, "-m", "divrl.cli", "toy", "new", "parity", "--dir", "divrl/toy"],
            cwd=t, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith('    "parity": '))
        _add_line(t / "divrl/toy/worlds.py", "WORLDS: dict[str, WorldKind] = {\n", line + "\n")

    score = (
        'printf \'%s\\n\' \'{"id": "a", "prompt": "q", "data_source": "hash_bench", '
        '"reward_model": {"ground_truth": "2.5"}}\' > rows.jsonl && printf \'%s\\n\' \'{"id": "a", '
        '"completion": "so #### 2.5000001"}\' > done.jsonl && '
        f"{py} -m divrl.cli score --data rows.jsonl --completions done.jsonl --out s.jsonl "
        "&& grep -q '\"score\": 1.0' s.jsonl"
    )
    tiny_run = (
        f"{py} -m divrl.cli train configs/toy/grpo.yaml model.toy_size=tiny train.total_steps=1 "
        "train.prompts_per_step=4 train.mini_batch_size=null rollout.n=4 rollout.max_new_tokens=8 "
        "logging.progress=false checkpoint.save_final=false"
    )
    return {
        "a policy loss (REINFORCE, no clip)": (
            loss,
            [
                f"{tiny_run} algorithm.policy_loss=reinforce algorithm.clip_low=null "
                "algorithm.clip_high=null algorithm.dual_clip=null "
                "algorithm.loss_agg=token-mean logging.output_dir=run_loss "
                "&& grep -q pg/loss run_loss/metrics.jsonl",
            ],
        ),
        "an advantage estimator (median baseline)": (
            estimator,
            [
                f"{tiny_run} algorithm.advantage=median logging.output_dir=run_adv "
                "&& grep -q adv/mean run_adv/metrics.jsonl",
            ],
        ),
        "a divergence (squared Hellinger)": (
            divergence,
            [
                f'{py} -c "from divrl.training.config import load_config; load_config(None, '
                "['algorithm.divergence=hellinger', 'algorithm.divergence_coef=0.1', "
                "'reference.per_step=2'])\"",
                f"{py} -m divrl.cli train --help > /dev/null",
            ],
        ),
        "a benchmark profile ('####' answers, tolerant numbers)": (profile, [score]),
        "a rollout engine (greedy wrapper of hf)": (
            engine,
            [
                f"{py} -m divrl.cli eval --model toy --data toy --engine greedy --n 2 --limit 2 "
                "--no-greedy --out ev --no-progress && test -s ev/summary.json",
            ],
        ),
        "a toy world (bit-string parity, by `divrl toy new parity --dir divrl/toy`)": (
            world,
            [
                f"{py} -m divrl.cli toy build --world parity --size tiny --quiet "
                "--cache-dir wc && ls wc/parity-tiny-seed0-*/data/ood_long.jsonl",
                f"{py} -m divrl.cli toy presets --world parity",
                f"{py} -m divrl.cli demo --world parity --size tiny --steps 1 --train-prompts 32 "
                "--eval-prompts 4 --n 2 --jobs 1 --out demo_parity && test -s demo_parity/report/report.md",
            ],
        ),
    }


def _shown(command: str) -> str:
    """The part of a shell line that runs divrl (not the files it writes or the checks)."""
    parts = command.split(" && ")
    return next((p for p in parts if "divrl" in p and "printf" not in p), parts[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="scratch folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies")
    parser.add_argument("--only", help="run only the additions whose title contains this")
    args = parser.parse_args(argv)
    base = args.out or Path(tempfile.mkdtemp(prefix="divrl-trial-"))
    print(
        "| added | library files added | library files edited | docs rewritten by the "
        "command | presets a command wrote | commands | passed |"
    )
    print("|---|---|---|---|---|---|---|")
    ok_all = True
    for i, (title, (write, commands)) in enumerate(_additions(sys.executable).items()):
        if args.only and args.only not in title:
            continue
        tree = base / f"trial{i}"
        _copy_tree(tree)
        write(tree)
        ok = _run(tree, f"{sys.executable} scripts/registry_tables.py", base / "cache")
        ok = all([ok, *(_run(tree, c, base / "cache") for c in commands)])
        added, edited, docs, presets = _changes(tree)
        folders = sorted({str(Path(p).parent) + "/" for p in presets})
        shown = "; ".join(_shown(c.replace(sys.executable, "python")) for c in commands)
        print(
            f"| {title} | {len(added)} ({', '.join(added)}) | {len(edited)} "
            f"({', '.join(edited)}) | {', '.join(docs) or 'none'} | "
            f"{len(presets)} ({', '.join(folders) or 'none'}) | `{shown}` | "
            f"{'yes' if ok else 'NO'} |"
        )
        ok_all &= ok
        if not args.keep:
            shutil.rmtree(tree, ignore_errors=True)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
