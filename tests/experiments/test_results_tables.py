"""The committed results pages' tables, recomputed from the summaries committed beside them:
a table row that the summaries do not give, digit for digit, fails (a page edited by hand
or a summary changed without its page). Reads JSON only: no run, no plot."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

import pytest

from experiments import reproduce_report as rr
from experiments import results_pages as rp
from experiments.reproduce_compare import like_for_like
from experiments.reproduce_publish import SUMMARIES
from experiments.results_commits import commits_section, made_in, read_commits
from experiments.sparks_dynamics import report as sparks_report

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
#: pages written by experiments.reproduce from <page>/summaries/
REPRODUCE_PAGES = [
    "countdown_reproduction",
    "countdown_reproduction_20261201",
    "rehearsal_control_sql",
    "toy_reproduction",
]


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def same_rows(committed: list[str], recomputed: list[str]) -> None:
    """Every committed row, in order, is a recomputed one; the recomputation may add only
    the claims the page's runs could not judge (methods not run: ``not run``)."""
    kept = set(committed)
    shown = [r for r in recomputed if r in kept or not r.endswith("| not run |")]
    for i, (a, b) in enumerate(zip(committed, shown, strict=False)):
        assert a == b, f"row {i + 1}:\n  committed:  {a}\n  recomputed: {b}"
    assert len(committed) == len(shown), f"{len(committed)} rows committed, {len(shown)} now"


@pytest.mark.parametrize("page", REPRODUCE_PAGES)
def test_a_reproduction_page_s_tables_are_its_summaries(page):
    folder = RESULTS / page
    summaries = rr.load_summaries(folder / SUMMARIES)
    assert like_for_like(summaries, allow=False, where=folder) == {}  # rebuilt without a mark
    presample = folder / "presample_seconds.json"
    md = rr.build_markdown(
        summaries,
        title="",
        preamble=[],
        presample_seconds=json.loads(presample.read_text()) if presample.is_file() else {},
        plots={},
    )
    md += "\n" + commits_section(summaries, read_commits(folder))  # which commit made each row
    assert "## Which commit made each row" in md
    same_rows(table_rows((RESULTS / f"{page}.md").read_text()), table_rows(md))


#: the sparks page's run records, per version of its world (version 1: the root's seed-0 runs)
SPARKS_RECORDS = {"v3": "v3/*_seed*.json", "v2": "v2/*_seed*.json", "v1": "*_seed0.json"}


@functools.cache
def sparks_rows(version: str) -> tuple[str, ...]:
    """The rows of the tables ``experiments.sparks_dynamics report`` prints for a version."""
    paths = sorted((RESULTS / "sparks_world").glob(SPARKS_RECORDS[version]))
    records = [json.loads(p.read_text()) for p in paths]
    records = [r for r in records if "checkpoints" in r]  # run records, not token records
    return tuple(table_rows(sparks_report(records)))


@pytest.mark.parametrize("version", ["v3", "v2"])
def test_the_sparks_page_s_tables_are_its_run_records(version):
    recomputed = list(sparks_rows(version))
    page = table_rows((RESULTS / "sparks_world.md").read_text())
    start = page.index(recomputed[0])  # each version's tables follow each other on the page
    same_rows(page[start : start + len(recomputed)], recomputed)


@pytest.mark.parametrize("page", rp.PAGES)
def test_a_hand_written_page_s_generated_tables_are_its_data(page):
    text = (RESULTS / page).read_text()
    assert rp.first_difference(text, rp.render(text)) is None


def test_a_changed_cell_of_a_generated_table_is_found():
    text = (RESULTS / "rehearsal_control.md").read_text()
    edited = text.replace("| 0.875 ± 0.018 |", "| 0.876 ± 0.018 |", 1)
    assert edited != text
    found = rp.first_difference(edited, rp.render(edited))
    assert "committed:" in found and "0.876 ± 0.018" in found and "0.875 ± 0.018" in found


HAND_WRITTEN = sorted(p.name for p in RESULTS.glob("*.md") if p.stem not in REPRODUCE_PAGES)


@pytest.mark.parametrize("page", HAND_WRITTEN)
def test_every_table_of_a_hand_written_page_is_recomputed_or_marked(page):
    elsewhere = [r for v in SPARKS_RECORDS for r in sparks_rows(v)] if "sparks" in page else []
    assert rp.unmarked_tables((RESULTS / page).read_text(), elsewhere) == []


def test_a_table_neither_generated_recomputed_nor_marked_is_named():
    text = "\n".join([
        "<!-- generated table: x -->", "| a |", "|---|", "| 1 |", "<!-- end of generated table -->",
        "", "*Not recomputed: the runs are gone.*", "", "| b |", "|---|", "| 2 |",
        "", "| c |", "|---|", "| 3 |", "", "| d |", "|---|", "| 4 |",
    ])  # fmt: skip
    assert rp.unmarked_tables(text, ["| d |", "|---|", "| 4 |"]) == ["line 13: | c |"]
    assert rp.unmarked_tables(text, ["| d |", "|---|"]) == ["line 13: | c |", "line 17: | d |"]


def test_a_changed_digit_is_found():
    with pytest.raises(AssertionError, match="row 2"):
        same_rows(["| a | 0.123 |", "| b | 0.456 |"], ["| a | 0.123 |", "| b | 0.457 |"])
    same_rows(["| a | 1 |"], ["| a | 1 |", "| c | x > y | - | not run |"])


def test_a_summary_s_commit_is_the_one_that_wrote_its_numbers_even_after_a_copy(tmp_path):
    def git(*args):
        env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
        env |= {"GIT_COMMITTER_EMAIL": "t@t", "PATH": os.environ["PATH"], "HOME": str(tmp_path)}
        return subprocess.run(["git", *args], cwd=tmp_path, env=env, check=True,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip

    git("init", "-q")
    (tmp_path / "a.json").write_text('{"pass@1": 0.1}\n')
    git("add", "a.json")
    git("commit", "-qm", "first round")
    first = git("log", "-1", "--format=%h %cs")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "a.json").write_text('{"pass@1": 0.1}\n')  # the first round kept
    (tmp_path / "a.json").write_text('{"pass@1": 0.2}\n')  # a rerun replaces it
    git("add", "-A")
    git("commit", "-qm", "second round")
    second = git("log", "-1", "--format=%h %cs")
    assert made_in(tmp_path / "a.json") == second
    assert made_in(tmp_path / "old" / "a.json") == first  # not the commit that copied it
    (tmp_path / "new.json").write_text("{}")
    assert made_in(tmp_path / "new.json") is None  # not committed
