"""experiments.reproduce's report refuses, or marks, summaries that are not like for like
(experiments/reproduce_compare.py) on synthetic per-run summaries."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from divrl.training.model_config import DataConfig
from experiments import reproduce, reproduce_publish
from experiments import reproduce_report as rr
from experiments.records import ResultError
from experiments.reproduce_compare import like_for_like, mark_rows, refuse_unlike_presets

DATA = {
    "train_path": "/w/train.jsonl",
    "template": "plain",
    "limit": None,
    "max_prompt_length": 256,
    "truncation": "drop",
    "skip_invalid": False,
}
SETTINGS = {"world": "full-seed0-abc", "toy_size": "full", "steps": 10, "n": 4,
            "eval_prompts": 8, "max_new_tokens": 32}  # fmt: skip


def summary(method, seed, p1, *, data=DATA, settings=SETTINGS, eval_data="sha256:aa"):
    ev = {
        "n_prompts": 8,
        "n_samples": settings["n"],
        "greedy": p1,
        "pass@k": {"1": p1, "4": min(1.0, 2 * p1)},
        "share_one_style": 0.5,
        "share_3plus_styles": 0.2,
        "mean_distinct_styles": 2.0,
        "retention": None,
    }
    s = {
        "schema": 1,
        "method": method,
        "seed": seed,
        "settings": dict(settings),
        "eval": {"test": ev},
        "wall_clock": {"train_seconds": 20.0, "eval_seconds": 5.0},
    }
    if eval_data is not None:
        s["provenance"] = {"eval": {"test": {"data": eval_data}}, "training": []}
    if method != "base" and data is not None:
        s["config"] = {"data": dict(data)}
    return s


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    """The report's plots are not what these tests check (and take seconds to draw)."""
    monkeypatch.setattr(reproduce_publish, "plot_entropy", lambda *a: False)
    monkeypatch.setattr(reproduce_publish, "plot_pass_at_k", lambda *a: False)


def write(tmp_path, summaries):
    folder = tmp_path / reproduce_publish.SUMMARIES
    folder.mkdir(exist_ok=True)
    for s in summaries:
        (folder / f"{s['method']}_seed{s['seed']}.json").write_text(json.dumps(s))
    return ["--report-only", "--results", str(tmp_path), "--report", str(tmp_path / "r.md")]


def mixed_truncation():
    left = {**DATA, "truncation": "left"}
    return [summary("base", 0, 0.3), summary("grpo", 0, 0.5), summary("dph_js", 0, 0.6, data=left)]


def test_mixed_truncation_is_refused_in_one_line_naming_both_runs(tmp_path, capsys):
    argv = write(tmp_path, mixed_truncation())
    assert reproduce.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "dph_js seed 0: trained with other data handling than grpo seed 0" in err
    assert "data.truncation 'left' vs 'drop'" in err and "--allow-mismatch" in err
    assert not (tmp_path / "r.md").exists()


def test_with_the_flag_the_rows_are_marked_and_the_difference_named(tmp_path, capsys):
    assert reproduce.main([*write(tmp_path, mixed_truncation()), "--allow-mismatch"]) == 0
    assert "not like for like (rows marked ⚠): dph_js seed 0: " in capsys.readouterr().out
    md = (tmp_path / "r.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| DPH-JS")]
    assert rows and all(line.startswith("| DPH-JS ⚠ |") for line in rows)
    assert "| GRPO ⚠" not in md and "| GRPO |" in md and "| base |" in md
    assert "| DPH-JS raises in-domain Pass@1 ⚠ |" in md  # a claim that reads the marked rows
    assert "| GRPO raises in-domain Pass@1 |" in md
    note = md.split("Not like for like")[1]
    assert "- dph_js seed 0: trained with other data handling than grpo seed 0: " in note
    assert "data.truncation 'left' vs 'drop'" in note


def test_like_summaries_give_the_report_they_gave_before(tmp_path):
    runs = [summary("base", 0, 0.3), summary("grpo", 0, 0.5), summary("dph_js", 0, 0.6)]
    write(tmp_path, runs)
    reproduce_publish.write_report(tmp_path, tmp_path / "r.md", None)
    md = (tmp_path / "r.md").read_text()
    assert "⚠" not in md and "like for like" not in md
    tables = [line for line in md.splitlines() if line.startswith("|")]
    plain = rr.build_markdown(rr.load_summaries(tmp_path / "summaries"), title="T")
    assert tables == [line for line in plain.splitlines() if line.startswith("|")]


@pytest.mark.parametrize(
    ("changed", "sentence"),
    [
        (dict(eval_data="sha256:bb"),
         "grpo seed 0: `test` was evaluated on other prompts than base seed 0's (data "
         "fingerprint bb vs aa)"),
        (dict(settings={**SETTINGS, "max_new_tokens": 64}),
         "grpo seed 0: `test` was evaluated with other settings than base seed 0's: "
         "max_new_tokens 64 vs 32"),
        (dict(settings={**SETTINGS, "eval_prompts": None}),
         "grpo seed 0: `test` was evaluated with other settings than base seed 0's: "
         "limit 'all' vs 8"),
        (dict(settings={**SETTINGS, "world": "full-seed1-def"}),
         "grpo seed 0: made in another world or for other steps than base seed 0: world "
         "'full-seed1-def' vs 'full-seed0-abc'"),
    ],
)  # fmt: skip
def test_each_setting_that_differs_is_named(changed, sentence):
    runs = [summary("base", 0, 0.3), summary("grpo", 0, 0.5, **changed)]
    with pytest.raises(ResultError, match=re.escape(sentence)):
        like_for_like(runs, allow=False, where="here")
    assert like_for_like(runs, allow=True, where="here") == {"grpo": [sentence]}


def test_a_summary_from_before_provenance_is_compared_on_what_it_records():
    old = summary("grpo", 1, 0.5, data=None, eval_data=None)  # no data handling, no prints
    new = [summary("base", 0, 0.3), summary("grpo", 0, 0.5)]
    assert like_for_like([*new, old], allow=False, where="here") == {}
    steps = summary("grpo", 1, 0.5, data=None, eval_data=None, settings={**SETTINGS, "steps": 5})
    assert "steps 5 vs 10" in like_for_like([*new, steps], allow=True, where="here")["grpo"][0]


def test_training_prompts_of_another_fingerprint_are_named():
    a, b = summary("grpo", 0, 0.5), summary("dph_js", 0, 0.6)
    a["provenance"]["training"] = [{"data": "sha256:" + "1" * 64, "prompts": 20}]
    b["provenance"]["training"] = [{"data": "sha256:" + "2" * 64, "prompts": 40}]
    marks = like_for_like([a, b], allow=True, where="here")
    assert marks == {"dph_js": ["dph_js seed 0: trained on other prompts than grpo seed 0 (data "
                                "fingerprint 222222222222, 40 prompts, vs 111111111111, 20 prompts)"]}  # fmt: skip


def test_mark_rows_marks_only_the_named_method_s_rows():
    md = "| GRPO | 1 |\n| GRPO + reverse KL | 2 |\ntext GRPO |\n| DPH | GRPO raises in-domain Pass@1 | x |"
    out = mark_rows(md, {"grpo_rkl": ["why"]})
    assert out == md.replace("| GRPO + reverse KL |", "| GRPO + reverse KL ⚠ |")
    assert mark_rows(md, {}) == md
    marked = mark_rows(md, {"grpo": ["why"]}).splitlines()
    assert marked[0] == "| GRPO ⚠ | 1 |" and marked[1] == "| GRPO + reverse KL | 2 |"
    assert marked[3] == "| DPH | GRPO raises in-domain Pass@1 ⚠ | x |"


def test_presets_that_handle_their_data_otherwise_are_refused_before_any_run():
    cfgs = {m: SimpleNamespace(data=DataConfig(truncation=t)) for m, t in
            (("grpo", "drop"), ("dph_js", "drop"), ("lp_reg", "left"))}  # fmt: skip
    with pytest.raises(ResultError, match=re.escape(
        "the lp_reg preset: trained with other data handling than the grpo preset: "
        "data.truncation 'left' vs 'drop': give every method the same data handling"
    )):  # fmt: skip
        refuse_unlike_presets(cfgs, allow=False)
    refuse_unlike_presets(cfgs, allow=True)
    refuse_unlike_presets({m: cfgs[m] for m in ("grpo", "dph_js")}, allow=False)
