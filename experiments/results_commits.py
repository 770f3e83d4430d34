"""Which commit made each row of a results page.

A committed results folder (``docs/results/<page>/``) keeps ``commits.json``: for each
per-run summary in its ``summaries/``, the commit that gave it its present content
(``git log``, followed across renames and copies), with that commit's date. A summary is written by the run that made it and committed with it, so
the commit names the latest code that can have made its numbers (the run used that
commit's code or an earlier one's). The report's last section lists, per method, the
commits of its seeds' summaries, so rows made by different code are told apart.

Usage (from the repository root, after committing the summaries)::

    python -m experiments.results_commits docs/results/countdown_reproduction [...]
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COMMITS_FILE = "commits.json"
NOT_COMMITTED = "not committed yet"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout.strip()


def made_in(path: Path) -> str | None:
    """``"<short hash> <date>"`` of the commit that gave ``path`` its present content:
    the oldest of the newest commits, followed across renames and copies, whose version
    of it is byte for byte the present one (a copy into another folder keeps the commit
    that wrote the numbers). None when git does not know the file."""
    cwd, name = path.parent, path.name
    now = _git(cwd, "hash-object", name)
    log = _git(cwd, "log", "--follow", "--format=@%h %cs", "--name-status", "--", name)
    made = None
    for block in log.split("@")[1:]:
        head, *status = [x for x in block.splitlines() if x.strip()]
        if not status or status[-1].startswith("D"):
            break
        old_path = status[-1].split("\t")[-1]
        root = _git(cwd, "rev-parse", "--show-toplevel")
        blob = subprocess.run(
            ["git", "rev-parse", f"{head.split()[0]}:{old_path}"],
            cwd=root, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        if blob != now:
            break
        made = head
    return made


def git_commits(summaries: Path) -> dict[str, str]:
    """``{file name: "<short hash> <date>"}`` of the commit that made each summary (see
    :func:`made_in`; files git does not know are left out)."""
    out = {}
    for path in sorted(Path(summaries).glob("*.json")):
        made = made_in(path)
        if made:
            out[path.name] = made
    return out


def read_commits(results: Path) -> dict[str, str]:
    """``results/commits.json``'s mapping, or ``{}`` when there is none."""
    path = Path(results) / COMMITS_FILE
    return json.loads(path.read_text())["summaries"] if path.is_file() else {}


def commits_section(summaries: Sequence[dict[str, Any]], commits: Mapping[str, str]) -> str:
    """The report's section naming, per method, the commit of each seed's summary."""
    if not summaries or not commits:
        return ""
    from experiments.reproduce_report import METHODS, by_method

    rows = []
    for method, runs in by_method(summaries).items():
        seeds: dict[str, list[int]] = {}
        for r in runs:
            made = commits.get(f"{method}_seed{r['seed']}.json", NOT_COMMITTED)
            seeds.setdefault(made, []).append(r["seed"])
        cell = "; ".join(
            f"{made} (seed{'s' if len(s) > 1 else ''} {', '.join(map(str, sorted(s)))})"
            for made, s in seeds.items()
        )
        rows.append(f"| {METHODS.get(method, method)} | {cell} |")
    return "\n".join(
        [
            "## Which commit made each row",
            "",
            "The commit that gave each run's summary its present content (`git log`, recorded in "
            f"`{COMMITS_FILE}` by `python -m experiments.results_commits`): the run used "
            "that commit's code or an earlier one's. Rows whose commits differ may come from "
            "different code.",
            "",
            "| method | summaries committed in (seeds) |",
            "|---|---|",
            *rows,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    folders = sys.argv[1:] if argv is None else argv
    if not folders:
        print("usage: python -m experiments.results_commits RESULTS_DIR [...]", file=sys.stderr)
        return 2
    for folder in map(Path, folders):
        commits = git_commits(folder / "summaries")
        how = "experiments.results_commits.made_in: git log --follow of each summary"
        data = {"how": how, "summaries": commits}
        (folder / COMMITS_FILE).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"{folder / COMMITS_FILE}: {len(commits)} summaries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
