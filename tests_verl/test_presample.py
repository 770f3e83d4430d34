"""The presample through verl (``trainer.v1.trainer_mode=divrl_presample``) end to end on a
CPU: verl's rollout workers generate, the reward function scores, verl's actor forward
gives the log-probs, the store is written; divrl's checks accept it and the plugin trains
from it with ``pi / pi_ref = 1`` on the rehearsal rows at step 1."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from transformers import AutoTokenizer

from divrl.data.fingerprint import model_fingerprint
from divrl.data.reference_store import ReferenceStore, StoreExpectation
from divrl.integrations.verl.data import write_exploration_split
from divrl.integrations.verl.presample import PresampleRow, split_rows
from tests_verl import e2e

TIMEOUT_S = 600
#: full credit on math-0 and math-2, none on math-3 and math-4
SPLIT_REWARD = Path(__file__).with_name("presample_reward.py")

pytestmark = pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")


def _row(pid: str, key: str, score: float) -> PresampleRow:
    return PresampleRow(key, pid, [1, 2], [3], [-0.5], score)


def test_the_split_is_divrl_presamples():
    rows = [_row("a", "a0", 1.0), _row("a", "a1", 1.0), _row("a", "a2", 1.0)]
    rows += [_row("b", "b0", 1.0), _row("b", "b1", 0.0), _row("b", "b2", 1.0)]
    rows += [_row("c", "c2", 0.0), _row("c", "c0", 1.0), _row("c", "c1", 1.0)]
    table, references, presampled = split_rows(rows, k=2)
    assert [(r["prompt_id"], r["split"], r["n_correct"], r["has_reference"]) for r in table] == [
        ("a", "near_perfect", 2, True),
        ("b", "exploration", 1, False),
        ("c", "near_perfect", 2, False),  # its extra response failed: near-perfect, no sample
    ]
    assert [r.key for r in references] == ["a2"]
    assert len(presampled) == 6
    with pytest.raises(ValueError, match=r"its own extra_info\.index"):
        split_rows(rows[:4], k=2)


def _run(root, model, data, out, *extra, reward=None) -> str:
    cmd = e2e.command(model, data, out, *extra, reward=reward)
    proc = subprocess.run(
        ["timeout", "-k", "10", str(TIMEOUT_S), *cmd],
        env=e2e.env(),
        cwd=root,
        capture_output=True,
        text=True,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    return log


def test_presample_through_verl_then_train_from_it(tmp_path):
    model = e2e.build_model(tmp_path / "model")
    # four prompts that fit data.max_prompt_length: verl's tokens of a longer one (math-1)
    # are not its whole rendering, which is what divrl's check below compares
    data = tmp_path / "train.parquet"
    rows = pd.read_parquet(e2e.write_data(data, n=5)).to_dict("records")
    rows = [r for r in rows if r["extra_info"]["index"] != "math-1"]
    pd.DataFrame(rows).to_parquet(data)
    store = tmp_path / "store"
    _run(
        tmp_path,
        model,
        data,
        tmp_path / "presample",
        "trainer.v1.trainer_mode=divrl_presample",
        f"+divrl.reference_store={store}",
        "trainer.total_epochs=1",
        reward=SPLIT_REWARD,
    )
    # divrl train's checks: the model's and the prompts' fingerprints, the samples
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [
        (
            str(row["extra_info"]["index"]),
            tok(
                tok.apply_chat_template(
                    list(row["prompt"]), tokenize=False, add_generation_prompt=True
                ),
                add_special_tokens=False,
            )["input_ids"],
        )
        for row in rows
    ]
    expect = StoreExpectation(model=model_fingerprint(model), prompts=prompts)
    opened = ReferenceStore.open(store, temperature=1.0, expect=expect, vocab_size=len(tok))
    assert sorted(s.prompt_id for s in opened.samples) == ["math-0", "math-2"]
    assert opened.manifest["stats"]["near_perfect"] == 2
    # where it came from: the prompts it was presampled for, by this checkout's code
    assert opened.manifest["provenance"]["data"] == expect.fingerprint()["prompts"]
    assert opened.manifest["provenance"]["versions"]["verl"] == __import__("verl").__version__
    exploration = tmp_path / "exploration.parquet"
    assert write_exploration_split(data, store, exploration) == 2
    # the plugin trains from it: the stored log-probs are verl's forward's
    log = _run(
        tmp_path,
        model,
        exploration,
        tmp_path / "train",
        "trainer.v1.trainer_mode=divrl_sync",
        "trainer.total_training_steps=1",
        "+divrl.divergence=js",
        "+divrl.divergence_coef=0.2",
        "+divrl.divergence_weighting=paper",
        f"+divrl.reference_store={store}",
        "+divrl.reference_per_step=2",
    )
    step = next(line for line in log.splitlines() if re.search(r"\bstep:1 - ", line))
    u_mean = float(re.search(r"actor/dph/u_mean:([-0-9.e]+)", step).group(1))
    assert abs(u_mean - 1.0) < 1e-3
