"""docs/trl.md runs as written: its ``divrl presample`` line, then every Python block, on a
CPU, in a fresh directory (the toy world; only the step count and batch are made smaller)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "trl.md"

# (text in the doc, what the test runs instead): a smaller run of the same code
SMALLER = [
    ("max_steps=100", "max_steps=1"),
    ("num_generations=8", "num_generations=4"),
    ("per_device_train_batch_size=8", "per_device_train_batch_size=4"),
]
# the presample is cut to the first prompts and fewer samples (the store stays where the
# doc says); its max_new_tokens is the doc's max_completion_length
PRESAMPLE_EXTRA = ["data.limit=24", "reference.k=4", "reference.threshold=2"]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_doc_names_the_new_fields_and_the_presample_store():
    text = DOC.read_text()
    (python,) = blocks(text, "python")
    removed = ("dph_divergence", "dph_eta", "dph_alpha", "lp_reg_rho", "lp_reg_kappa")
    assert not [old for old in removed if f"{old}=" in python]  # current names only
    (bash,) = blocks(text, "bash")[1:]  # the first bash block is `pip install`
    config = ROOT / shlex.split(bash.split("#")[0])[2]
    store = re.search(r'store = "([^"]+)"', python).group(1)
    assert f"store: {store}" in config.read_text()  # where `divrl presample` writes
    # the dataset is built with the presample config's data settings
    from divrl.training.config import load_config

    data = load_config(config).data
    call = python[python.index("trl_dataset(\n") :].split(")\n")[0]
    assert f"max_prompt_length={data.max_prompt_length}" in call
    assert f'truncation="{data.truncation}"' in call
    (readme_diff,) = blocks((ROOT / "README.md").read_text(), "diff")
    assert f'reference_store="{store}"' in readme_diff  # the README's TRL snippet agrees


@pytest.mark.slow
def test_trl_doc_runs_as_written_on_a_cpu(tmp_path, monkeypatch, tmp_path_factory):
    from divrl.cli import main

    monkeypatch.setenv("DIVRL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    text = DOC.read_text()
    (presample_line,) = [b for b in blocks(text, "bash") if "divrl presample" in b]
    command = shlex.split(presample_line.split("#")[0])
    assert command[:2] == ["divrl", "presample"]
    assert main([*command[1:], *PRESAMPLE_EXTRA, "logging.progress=false"]) == 0
    assert (tmp_path / "runs/toy/dph_reference/manifest.json").is_file()

    (code,) = blocks(text, "python")
    for doc_text, smaller in SMALLER:
        assert doc_text in code, f"docs/trl.md no longer has {doc_text!r}: update this test"
        code = code.replace(doc_text, smaller)
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 1
    logged = trainer.state.log_history[0]
    assert "divrl/dph/divergence" in logged and "divrl/lp_reg/num_selected" in logged
    # the trainer rolls out the store's exploration prompts only, by divrl's ids
    from divrl.data.reference_store import ReferenceStore

    ids = set(trainer.train_dataset["prompt_id"])
    assert ids and ids <= ReferenceStore(tmp_path / "runs/toy/dph_reference").exploration_ids
