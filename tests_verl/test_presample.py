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
from divrl.integrations.verl.presample import (
    EPOCH_PADDING,
    EpochPadded,
    PresampleRow,
    check_coverage,
    dataset_prompt_ids,
    kept,
    split_rows,
)
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


def test_the_epoch_padded_to_whole_batches_reaches_every_prompt_once():
    from torchdata.stateful_dataloader import StatefulDataLoader

    rows = [{"index": f"q{i}", "extra_info": {"index": f"q{i}"}} for i in range(5)]
    padded = EpochPadded(rows, extra=-5 % 2)
    assert len(padded) == 6 and padded[5]["index"] == f"{EPOCH_PADDING}q0"
    seen = [
        i
        for b in StatefulDataLoader(padded, batch_size=2, drop_last=True, collate_fn=list)
        for r in b
        for i in [r["index"]]
    ]
    # verl's loader over the dataset alone (drop_last=True) yields 4 of the 5
    assert len(list(StatefulDataLoader(rows, batch_size=2, drop_last=True, collate_fn=list))) == 2
    assert sorted(i for i in seen if kept({}, i)) == ["q0", "q1", "q2", "q3", "q4"]
    assert not kept({"is_padding": True}, "q0")  # verl's padding row copies a real index


def test_prompt_ids_missing_duplicated_or_not_covered_are_refused():
    assert dataset_prompt_ids([{"extra_info": {"index": 3}}, {"extra_info": {"index": "a"}}]) == [
        "3",
        "a",
    ]
    with pytest.raises(ValueError, match=r"row 1 of data.train_files has no extra_info.index"):
        dataset_prompt_ids([{"extra_info": {"index": 3}}, {"extra_info": {}}])
    with pytest.raises(ValueError, match=r"rows 0 and 2 of data.train_files share .*'a'"):
        dataset_prompt_ids([{"extra_info": {"index": "a"}}, {"extra_info": {"index": "b"}}] * 2)
    table = [{"prompt_id": "a"}, {"prompt_id": "b"}]
    check_coverage(table, ["b", "a"])
    with pytest.raises(ValueError, match=r"missing \['c'\], extra \[\]; no store was written"):
        check_coverage(table, ["a", "b", "c"])


def test_a_file_without_indexes_is_refused_naming_the_command_that_adds_them(tmp_path):
    """verl's dataset reads a missing ``extra_info.index`` as 0 (every row one prompt id), so
    the presample refuses the file at start-up naming ``divrl data index``; the copy that
    command writes gives every row its own id, the same one divrl's reading of it gives."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from divrl.data import load_examples
    from divrl.integrations.verl.data import assign_indexes

    raw = e2e.write_data(tmp_path / "raw.parquet", n=3)
    frame = pd.read_parquet(raw)
    frame["extra_info"] = [{"split": e["split"]} for e in frame["extra_info"]]
    frame.to_parquet(raw)
    tokenizer = AutoTokenizer.from_pretrained(e2e.build_model(tmp_path / "model"))
    config = OmegaConf.create({"max_prompt_length": 256, "cache_dir": str(tmp_path / "cache")})
    dataset = RLHFDataset(str(raw), tokenizer, config)
    assert [dataset[i]["index"] for i in range(3)] == [0, 0, 0]  # verl's default
    with pytest.raises(ValueError, match=r"row 0 .* no extra_info.index.*`divrl data index FILE"):
        dataset_prompt_ids(dataset)
    assign_indexes(raw, tmp_path / "indexed.parquet")
    dataset = RLHFDataset(str(tmp_path / "indexed.parquet"), tokenizer, config)
    assert dataset_prompt_ids(dataset) == ["0", "1", "2"]
    assert [ex.id for ex in load_examples(tmp_path / "indexed.parquet")] == ["0", "1", "2"]


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
    # five prompts that fit data.max_prompt_length: verl's tokens of a longer one (math-1)
    # are not its whole rendering, which is what divrl's check below compares; five at
    # data.train_batch_size=2: verl's dataloader (drop_last=True) alone would drop one
    data = tmp_path / "train.parquet"
    rows = pd.read_parquet(e2e.write_data(data, n=7)).to_dict("records")
    rows = [r for r in rows if r["extra_info"]["index"] not in ("math-1", "math-5")]
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
        "trainer.total_training_steps=null",
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
    # every prompt split, the last partial batch's too; the exploration file written
    assert opened.manifest["stats"]["prompts"] == 5
    exploration = Path(f"{store}.exploration.parquet")
    explored = pd.read_parquet(exploration)["extra_info"].map(lambda e: e["index"])
    assert sorted(explored) == ["math-3", "math-4", "math-6"]
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
