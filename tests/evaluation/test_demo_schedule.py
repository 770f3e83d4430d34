"""How ``divrl demo`` spreads its trainings and evaluations over processes.

Three trainings started two at a time on two cores leave a core idle while the third runs
alone, and evaluations held back until every training ended leave one idle again while
the slowest finishes. These tests pin the schedule that avoids both: every training and
the base model's evaluation at once, each model's evaluation queued ahead as its training
ends.
"""

from types import SimpleNamespace

import pytest

import divrl.pipeline as pipeline
from divrl.cli import build_parser_for
from divrl.commands import demo
from divrl.evaluation.runner import EvalConfig


class _Proc:
    """A stand-in subprocess that ends with ``rc`` after ``polls`` polls."""

    def __init__(self, polls: int, rc: int = 0) -> None:
        self.polls, self.rc = polls, rc

    def poll(self):
        self.polls -= 1
        return self.rc if self.polls < 0 else None

    def terminate(self) -> None:
        pass


def _fake_processes(monkeypatch, lengths: dict[str, int], failing=()):
    """Patch the runner's process start and sleep; the list of (event, task) it records."""
    events = []

    def start(cmd, log, threads=1):
        name = cmd[-1]
        events.append(("start", name))
        return _Proc(lengths[name], rc=1 if name in failing else 0)

    monkeypatch.setattr(pipeline, "start_logged", start)
    monkeypatch.setattr(pipeline.time, "sleep", lambda seconds: None)
    return events


def _task(name: str, then=()) -> tuple:
    # the argv's last item names the task for the stand-in processes
    return (name, [name], pipeline.Path("/nonexistent/progress"), 1, tuple(then))


def test_a_follow_up_starts_when_its_task_ends_ahead_of_the_queued_tasks(tmp_path, monkeypatch):
    events = _fake_processes(monkeypatch, {"a": 1, "b": 5, "c": 1, "a2": 1})
    tasks = [_task("a", then=[_task("a2")]), _task("b"), _task("c")]
    pipeline.run_parallel(tasks, jobs=2, logs=tmp_path)
    # a ends first: its follow-up a2 takes the free slot before c, queued since the start
    assert [name for _, name in events] == ["a", "b", "a2", "c"]


def test_a_failed_task_starts_no_follow_up_and_is_reported(tmp_path, monkeypatch):
    events = _fake_processes(monkeypatch, {"a": 0, "a2": 0, "b": 0}, failing={"a"})
    with pytest.raises(RuntimeError, match=r"failed: a \(exit 1"):
        pipeline.run_parallel([_task("a", then=[_task("a2")]), _task("b")], 2, tmp_path)
    assert [name for _, name in events] == ["a", "b"]


def test_the_demo_trains_every_method_at_once_each_followed_by_its_evaluation(
    tmp_path, monkeypatch
):
    """By default the demo runs its three trainings and the base model's evaluation at
    once (not two at a time), and each training is followed by its model's evaluation."""
    args = build_parser_for(["demo"]).parse_args(["demo", "--out", str(tmp_path)])
    assert args.jobs is None
    methods = list(demo.METHODS)
    args.jobs = demo.default_jobs(methods)
    assert args.jobs == len(methods) + 1 > 2

    root = tmp_path / "world"
    splits = {s: root / f"{s}.jsonl" for s in ("train", "test", "ood_math")}
    world = SimpleNamespace(model_dir=root / "model", splits=splits, db_dir=None, root=root)
    eval_cfg = EvalConfig(n=2, max_new_tokens=8, limit=2)
    out = tmp_path / "demo"
    beside, then = demo._evals_beside_training(
        methods, args, out, world, eval_cfg, ["test", "ood_math"]
    )
    calls = []
    monkeypatch.setattr(demo, "run_parallel", lambda *a: calls.append(a))
    with pytest.raises(RuntimeError, match="no final checkpoint"):  # nothing really trained
        demo._train_all(
            methods, {}, args, tmp_path, out, world, pipeline.Clock(lambda _: None), beside, then
        )
    ((tasks, jobs, _),) = calls
    assert jobs == len(methods) + 1
    assert [t[0] for t in tasks] == [*(f"train {m}" for m in methods), "evaluate base"]
    for m, task in zip(methods, tasks, strict=False):
        ((follow_up,),) = [task[4]]
        assert follow_up[0] == f"evaluate {m}"
        model = follow_up[1][follow_up[1].index("--model") + 1]
        assert model == str(pipeline.RunDir(out / m).checkpoint(args.steps).model_dir)
