"""Result writers replace their files whole (issue 18): a write interrupted halfway (a
full disk) leaves the previous file, not half of the new one, and no temp file."""

from __future__ import annotations

import errno
import json
import os

import pytest

import divrl.fileio
from divrl.evaluation.report import build_report, load_model_eval
from divrl.evaluation.runner import EvalConfig, evaluate


def _fail_halfway(marker: bytes):
    """A replacement for fileio's low-level write: data holding ``marker`` is written
    halfway, then the disk is full."""
    real = divrl.fileio._write_all

    def write(fd: int, data: bytes) -> None:
        if marker in data:
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    return write


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp" in p.name)


def test_an_interrupted_eval_summary_keeps_the_previous_one(
    tmp_path, monkeypatch, write_hand_samples
):
    out = tmp_path / "run"
    write_hand_samples(out)
    evaluate(None, None, out, EvalConfig(n=2), reuse=True)
    before = (out / "summary.json").read_bytes()
    assert json.loads(before)["mean_accuracy"] == 0.5

    monkeypatch.setattr(divrl.fileio, "_write_all", _fail_halfway(b'"mean_accuracy"'))
    with pytest.raises(divrl.fileio.DiskFullError, match=r"summary\.json"):
        evaluate(None, None, out, EvalConfig(n=2), reuse=True)
    assert (out / "summary.json").read_bytes() == before
    assert _leftovers(out) == []


def test_an_interrupted_report_keeps_the_previous_one(tmp_path, monkeypatch, write_hand_samples):
    # an evaluated base model: scored samples of the hand-made eval set
    evaluated = tmp_path / "base" / "test"
    write_hand_samples(evaluated)
    evaluate(None, None, evaluated, EvalConfig(n=2), reuse=True)
    base = load_model_eval(tmp_path / "base", "base")
    out = tmp_path / "report"
    build_report([], base, out, title="first")
    md, html = (out / "report.md").read_bytes(), (out / "report.html").read_bytes()
    assert b"first" in md and b"first" in html

    # every write of the report fails halfway: the first one (report.md) stops it
    monkeypatch.setattr(divrl.fileio, "_write_all", _fail_halfway(b"second"))
    with pytest.raises(divrl.fileio.DiskFullError, match=r"report\.md"):
        build_report([], base, out, title="second")
    assert (out / "report.md").read_bytes() == md
    assert (out / "report.html").read_bytes() == html
    assert _leftovers(out) == []
