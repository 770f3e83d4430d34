"""Writes under faults (issue 18, findings 5, 10, 12): a full disk while appending metrics or
checkpointing, a torn metrics line, a truncated optimizer.bin, NaN/inf in the config and
in metrics."""

import dataclasses
import errno
import json
import math
import typing
from pathlib import Path

import pytest
import torch
from train_helpers import sevens_reward, tiny_overrides

from divrl import fileio
from divrl.fileio import DiskFullError, append_record, atomic_write_text
from divrl.runs import RunDir
from divrl.training.config import Config, ConfigError, load_config
from divrl.training.metrics import read_metrics, strict_json_record, truncate_metrics
from divrl.training.trainer import TIME_KEYS, Trainer


def _strict_loads(line):
    def refuse(name):
        raise ValueError(f"non-strict JSON constant {name}")

    return json.loads(line, parse_constant=refuse)


def _config(world, out, **extra):
    base = {"train.total_steps": 3, "checkpoint.save_every": 1, "checkpoint.keep_last": 3}
    return load_config(None, tiny_overrides(world, out, **{**base, **extra}))


def _no_time(rows):
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]


def test_disk_full_while_appending_metrics_leaves_whole_records(tiny_world, tmp_path, monkeypatch):
    real_write = fileio.os.write

    def full_disk_at_step_2(fd, data):
        if b'"step": 2' in bytes(data) and b"actor/lr" in bytes(data):  # metrics only
            real_write(fd, bytes(data)[:25])  # half a record reaches the disk, then ENOSPC
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(fileio.os, "write", full_disk_at_step_2)
    with pytest.raises(DiskFullError) as err:
        Trainer(_config(tiny_world, tmp_path), reward_fn=sevens_reward).train()
    message = str(err.value)
    assert str(tmp_path / "metrics.jsonl") in message and "free on that disk" in message
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [_strict_loads(x)["step"] for x in lines] == [1]  # the torn half was cut back
    assert not (tmp_path / ".lock").exists()
    history = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert history[-1]["event"] == "failed"

    monkeypatch.setattr(fileio.os, "write", real_write)  # space freed: --resume continues
    resumed = Trainer(_config(tiny_world, tmp_path), reward_fn=sevens_reward, resume=True)
    resumed.train()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_disk_full_while_checkpointing_names_the_path_and_keeps_the_last(
    tiny_world, tmp_path, monkeypatch
):
    tr = Trainer(_config(tiny_world, tmp_path), reward_fn=sevens_reward)
    real_save = torch.save

    def full_at_step_2(obj, path, *args, **kwargs):
        if tr.step == 2:  # torch's zip writer reports ENOSPC as a RuntimeError
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_at_step_2)
    monkeypatch.setattr(fileio, "free_bytes", lambda path: 1000)
    with pytest.raises(DiskFullError) as err:
        tr.train()
    message = str(err.value)
    assert "disk full while writing" in message and ".tmp_step_000002" in message
    assert "1000 B free on that disk" in message and "inline_container" in message
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000001"]  # the partial checkpoint's space is given back


def test_enospc_from_the_os_is_a_disk_full_error(tmp_path, monkeypatch):
    def enospc(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    target = tmp_path / "config.yaml"
    target.write_text("old")
    monkeypatch.setattr(fileio.os, "write", enospc)
    with pytest.raises(DiskFullError, match=f"disk full while writing {target}"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]
    with pytest.raises(DiskFullError, match="free on that disk"):
        append_record(tmp_path / "m.jsonl", '{"step": 1}')


def test_a_torn_last_metrics_line_is_reported_and_dropped(tiny_world, tmp_path, caplog):
    Trainer(_config(tiny_world, tmp_path), reward_fn=sevens_reward).train(max_steps=2)
    metrics = tmp_path / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"step": 3, "reward/sco')  # a crash mid-record (before this fix: disk full)
    with caplog.at_level("WARNING"):
        tr = Trainer(_config(tiny_world, tmp_path), reward_fn=sevens_reward, resume=True)
        tr.train()
    assert f"{metrics}: dropping a torn last line 3" in caplog.text
    assert [r["step"] for r in read_metrics(metrics)] == [1, 2, 3]

    metrics.write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
    with pytest.raises(ValueError, match=f"{metrics}: line 2 is not a JSON record"):
        read_metrics(metrics)


def test_resume_truncation_replaces_the_file_atomically(tmp_path, monkeypatch):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3, 4)))
    replaced = []
    real_replace = fileio.os.replace
    monkeypatch.setattr(
        fileio.os, "replace", lambda a, b: (replaced.append((a, b)), real_replace(a, b))
    )
    truncate_metrics(metrics, 2)
    assert [r["step"] for r in read_metrics(metrics)] == [1, 2]
    assert replaced and replaced[0][1] == metrics and replaced[0][0] != metrics


def _resume_past_damaged_step_3(world, run, caplog, **extra) -> Trainer:
    """Resume a 3-step run whose step-3 checkpoint is damaged: it loads step 2 with a
    warning, trains step 3 again and sets the damaged one aside."""
    with caplog.at_level("WARNING"):
        tr = Trainer(_config(world, run, **extra), reward_fn=sevens_reward, resume=True)
    assert tr.step == 2
    assert "step_000003 does not load" in caplog.text and "previous one" in caplog.text
    tr.train()
    assert (run / "checkpoints" / "corrupt_step_000003").is_dir()
    return tr


def test_a_truncated_latest_optimizer_falls_back_to_the_previous_checkpoint(
    tiny_world, tmp_path, caplog
):
    full = Trainer(_config(tiny_world, tmp_path / "full"), reward_fn=sevens_reward)
    expected = _no_time(full.train())
    run = tmp_path / "run"
    Trainer(_config(tiny_world, run), reward_fn=sevens_reward).train()
    optimizer_bin = RunDir(run).checkpoint(3).state_dir / "optimizer.bin"
    data = optimizer_bin.read_bytes()
    optimizer_bin.write_bytes(data[: len(data) // 2])  # cut mid-file: a bare EOFError before
    tr = _resume_past_damaged_step_3(tiny_world, run, caplog)
    assert [c.step for c in RunDir(run).checkpoints()] == [1, 2, 3]
    assert _no_time(read_metrics(run / "metrics.jsonl")) == expected  # step 3 redone exactly
    a = full.accelerator.unwrap_model(full.model).state_dict()
    b = tr.accelerator.unwrap_model(tr.model).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("damage", ["truncated_shard", "metadata_gone"])
def test_a_damaged_latest_sharded_checkpoint_falls_back_to_the_previous_one(
    tiny_world, tmp_path, caplog, damage
):
    fsdp = {"train.strategy": "fsdp"}
    full = Trainer(_config(tiny_world, tmp_path / "full", **fsdp), reward_fn=sevens_reward)
    expected = _no_time(full.train())
    run = tmp_path / "run"
    Trainer(_config(tiny_world, run, **fsdp), reward_fn=sevens_reward).train()
    state = RunDir(run).checkpoint(3).path / "state"
    if damage == "truncated_shard":
        shard = sorted(state.glob("*.distcp"))[0]
        shard.write_bytes(shard.read_bytes()[:100])
    else:
        (state / ".metadata").unlink()
    _resume_past_damaged_step_3(tiny_world, run, caplog, **fsdp)
    assert [c.step for c in RunDir(run).checkpoints()] == [1, 2, 3]
    assert _no_time(read_metrics(run / "metrics.jsonl")) == expected  # step 3 redone exactly


def _float_keys():
    """Every float option of the config (float, float | None, list[float])."""
    for section in dataclasses.fields(Config):
        hints = typing.get_type_hints(typing.get_type_hints(Config)[section.name])
        for name, tp in hints.items():
            if float in (tp, *typing.get_args(tp)) or tp == list[float]:
                yield f"{section.name}.{name}", tp == list[float]


@pytest.mark.parametrize("bad", ["nan", ".inf", "-.inf"])
def test_every_float_option_rejects_nan_and_inf(bad):
    keys = list(_float_keys())
    assert {"optim.lr", "optim.max_grad_norm", "algorithm.clip_low"} <= {k for k, _ in keys}
    for key, is_list in keys:
        value = f"[0.9, {bad}]" if is_list else bad
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(None, [f"{key}={value}"])


@pytest.mark.parametrize("key", ["rho", "beta", "kappa"])
def test_nan_inside_the_loss_options_is_refused_naming_the_option(key):
    """The check did not look inside algorithm.loss_options: rho=nan crashed at step 1,
    beta=nan skipped every step."""
    with pytest.raises(ConfigError, match=rf"algorithm\.loss_options\.{key}=nan must be a finite"):
        load_config(None, ["algorithm.policy_loss=lp_reg", f"algorithm.loss_options.{key}=.nan"])


def test_metrics_are_strict_json_with_a_count_of_non_finite_values(tmp_path):
    line = strict_json_record({"step": 1, "loss/total": math.nan, "a": math.inf, "b": 0.5})
    record = _strict_loads(line)
    assert record == {"step": 1, "loss/total": None, "a": None, "b": 0.5, "nonfinite_count": 2}
    assert _strict_loads(strict_json_record({"step": 2, "b": 1.0})) == {"step": 2, "b": 1.0}


def test_train_honours_data_skip_invalid(tiny_world, tmp_path):
    from divrl.data import DataValidationError

    data = tmp_path / "train.jsonl"
    good = Path(tiny_world["data"]).read_bytes()
    data.write_bytes(good + b'{"prompt": "\xff"}\n')
    args = {"data.train_path": data, "train.total_steps": 1}
    with pytest.raises(DataValidationError, match=r"row 17: .*invalid UTF-8"):
        Trainer(load_config(None, tiny_overrides(tiny_world, tmp_path / "a", **args)))
    cfg = load_config(
        None, tiny_overrides(tiny_world, tmp_path / "b", **args, **{"data.skip_invalid": True})
    )
    assert len(Trainer(cfg, reward_fn=sevens_reward).prompts) == 16
