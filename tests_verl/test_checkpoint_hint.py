"""The merger command ``divrl eval`` names for a verl checkpoint it cannot read parses with
verl 0.9.1's own ``verl.model_merger`` arguments, as the fsdp merge of that ``actor/``."""

from __future__ import annotations

import re
import shlex
import sys

from divrl.checkpoint.verl_checkpoint import VerlCheckpoint, merger_hint


def test_the_named_merger_command_is_verls(tmp_path, monkeypatch):
    from verl.model_merger.base_model_merger import generate_config_from_args, parse_args

    actor = tmp_path / "global_step_4" / "actor"
    hint = merger_hint(VerlCheckpoint(4, actor))
    command = shlex.split(re.search(r"`(python -m verl\.model_merger [^`]*)`", hint).group(1))
    assert command[:3] == ["python", "-m", "verl.model_merger"]
    monkeypatch.setattr(sys, "argv", ["verl.model_merger", *command[3:]])
    config = generate_config_from_args(parse_args())
    assert (config.operation, config.backend) == ("merge", "fsdp")
    assert config.local_dir == str(actor)
    assert config.hf_model_config_path == str(actor / "huggingface")
    assert config.target_dir == str(actor.parent / "hf_model")
    assert "checkpoint.save_contents=[model,optimizer,extra,hf_model]" in hint
