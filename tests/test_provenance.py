"""divrl.provenance: the fields are the real ones (commit, dirty flag, versions, threads),
absent without a checkout, and the config hash survives a round trip through its file."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from divrl import provenance as prov


def _git(repo, *args):
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_git_state_is_the_checkouts_commit_and_dirty_flag(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", "a.txt")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    clean = prov.git_state.__wrapped__(repo)
    assert clean == {"commit": _git(repo, "rev-parse", "HEAD"), "dirty": False}
    (repo / "untracked.txt").write_text("not part of the code\n")
    assert prov.git_state.__wrapped__(repo)["dirty"] is False
    (repo / "a.txt").write_text("two\n")
    assert prov.git_state.__wrapped__(repo)["dirty"] is True
    # not a checkout: absent, never an error
    (tmp_path / "plain").mkdir()
    assert prov.git_state.__wrapped__(tmp_path / "plain") is None


def test_versions_threads_and_device_are_the_imported_ones():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import divrl

    record = prov.provenance(config={"x": 1}, data="sha256:d", engine="hf")
    assert record["versions"]["torch"] == torch.__version__
    assert record["versions"]["transformers"] == transformers.__version__
    assert record["versions"]["divrl"] == divrl.__version__
    assert record["threads"]["torch"] == torch.get_num_threads()
    assert record["device"] == ("cpu" if not torch.cuda.is_available() else record["device"])
    assert (record["data"], record["engine"]) == ("sha256:d", "hf")
    assert record["config_hash"] == prov.config_hash({"x": 1})
    assert record["cpu"] and record["cpu"] != "unknown"
    json.dumps(record)  # every field is JSON


def test_config_hash_is_canonical_and_tells_configs_apart():
    @dataclasses.dataclass
    class C:
        a: int = 1
        stop: tuple[str, ...] = ("x",)

    read_back = json.loads(json.dumps(dataclasses.asdict(C())))
    assert prov.config_hash(C()) == prov.config_hash(read_back)
    assert prov.config_hash({"b": 1, "a": 2}) == prov.config_hash({"a": 2, "b": 1})
    assert prov.config_hash(C(a=2)) != prov.config_hash(C())
    assert prov.records_fingerprint([1, 2]) != prov.records_fingerprint([2, 1])


def test_a_runs_sessions_and_an_experiment_summary_carry_the_records(tmp_path):
    from divrl.evaluation.report_provenance import experiment_provenance
    from divrl.runs import RunDir

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    assert run.provenance() == []  # a run from before provenance.json: none, no error
    run.add_provenance({"event": "start", "data": "sha256:a"})
    run.add_provenance({"event": "resume", "data": "sha256:a"})
    assert [p["event"] for p in run.provenance()] == ["start", "resume"]
    assert run.provenance_path in run.run_files()  # --overwrite deletes it with the run
    (tmp_path / "eval" / "test").mkdir(parents=True)
    record = {"provenance": {"data": "sha256:e"}}
    (tmp_path / "eval" / "test" / "eval_config.json").write_text(json.dumps(record))
    summary = experiment_provenance(run.root, tmp_path / "eval", ["test", "absent"])
    assert summary["training"] == run.provenance()
    assert summary["eval"] == {"test": {"data": "sha256:e"}, "absent": None}
    assert summary["summary"]["git"] == prov.git_state()
