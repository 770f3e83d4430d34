"""A TRL run through the adapter records its provenance in ``output_dir/provenance.json``,
the file and record of ``divrl train``: one record at the start, one more per resume."""

from __future__ import annotations

import json

import pytest
import torch
from trl_helpers import make_args, prompt_dataset, tiny_model, tiny_tokenizer, varied_reward

trl = pytest.importorskip("trl")

from divrl.integrations.trl import DivRLGRPOTrainer  # noqa: E402
from divrl.provenance import config_hash, git_state, package_versions, records_fingerprint  # noqa: E402
from divrl.runs import RunDir  # noqa: E402

torch.set_num_threads(1)


def run(out, max_steps, resume=None):
    args = make_args(
        out, max_steps=max_steps, save_strategy="steps", save_steps=1, output_dir=str(out)
    )
    trainer = DivRLGRPOTrainer(
        model=tiny_model(0),
        reward_funcs=varied_reward,
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tiny_tokenizer(),
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_a_trl_run_records_provenance_and_a_resume_appends_a_record(tmp_path):
    out = tmp_path / "run"
    first = run(out, max_steps=1)
    (record,) = RunDir(out).provenance()
    assert (record["event"], record["step"], record["trainer"]) == ("start", 0, "trl")
    assert record["git"] == git_state()
    assert record["versions"] == package_versions() and record["versions"]["trl"] == trl.__version__
    assert record["config_hash"] == config_hash(json.loads(first.args.to_json_string()))
    assert record["data"] == records_fingerprint(first.train_dataset)
    assert record["engine"] == "transformers" and record["prompts"] == len(first.train_dataset)

    resumed = run(out, max_steps=2, resume=str(out / "checkpoint-1"))
    assert resumed.state.global_step == 2
    sessions = json.loads((out / "provenance.json").read_text())["sessions"]
    assert [(s["event"], s["step"]) for s in sessions] == [("start", 0), ("resume", 1)]
    assert sessions[0] == record  # the first record is kept as written
    assert sessions[1]["config_hash"] == config_hash(json.loads(resumed.args.to_json_string()))
    assert sessions[1]["config_hash"] != record["config_hash"]  # max_steps changed
