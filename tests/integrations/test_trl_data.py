"""TRL datasets with divrl's prompt ids, the exploration filter, the verifier reward, the
renamed config fields and the store's model check inside TRL."""

from __future__ import annotations

import json
import logging

import pytest
from trl_helpers import make_args, prompt_dataset, tiny_model, varied_reward

pytest.importorskip("trl")

from divrl.data import reference_store as store_module
from divrl.data.fingerprint import model_fingerprint
from divrl.data.reference_store import (
    MANIFEST,
    ReferenceSample,
    StoreMismatchError,
    write_reference_store,
)
from divrl.integrations.trl import (
    DivRLGRPOTrainer,
    exploration_dataset,
    trl_dataset,
    verifier_reward,
)


def _split_store(path, n_prompts: int):
    """A store whose even prompts q0, q2, ... are near-perfect (one sample each)."""
    ids = [f"q{i}" for i in range(n_prompts)]
    samples = [ReferenceSample(pid, [1], [3], [-0.5]) for pid in ids[::2]]
    rows = [
        {
            "prompt_id": pid,
            "n_correct": 4 * (i % 2 == 0),
            "split": "near_perfect" if i % 2 == 0 else "exploration",
            "has_reference": i % 2 == 0,
        }
        for i, pid in enumerate(ids)
    ]
    return write_reference_store(path, samples, rows, {"log_prob_temperature": 1.0})


def test_exploration_dataset_reads_the_store_once(tmp_path, monkeypatch):
    from datasets import Dataset

    store = _split_store(tmp_path / "store", 1000)
    opened = []
    real_init = store_module.ReferenceStore.__init__
    monkeypatch.setattr(
        store_module.ReferenceStore,
        "__init__",
        lambda self, path: opened.append(path) or real_init(self, path),
    )
    data = Dataset.from_dict({"prompt": ["x"] * 1000, "prompt_id": [f"q{i}" for i in range(1000)]})
    kept = exploration_dataset(data, store)
    assert kept["prompt_id"] == [f"q{i}" for i in range(1, 1000, 2)]
    assert len(opened) == 1


def test_exploration_dataset_refuses_foreign_ids_and_warns_on_some(tmp_path, caplog):
    from datasets import Dataset

    store = _split_store(tmp_path / "store", 4)
    with pytest.raises(ValueError, match="none of the dataset's 2 prompt ids is in the reference"):
        exploration_dataset(Dataset.from_dict({"prompt_id": ["a", "b"]}), store)
    with pytest.raises(ValueError, match=r"records no per-prompt keys .* presample again"):
        exploration_dataset(Dataset.from_dict({"prompt": ["a"]}), store)  # an older store
    with pytest.raises(ValueError, match="neither a 'prompt_id' column"):
        exploration_dataset(Dataset.from_dict({"text": ["a"]}), store)
    mixed = Dataset.from_dict({"prompt_id": ["q0", "q1", "zz"]})
    with caplog.at_level(logging.INFO, logger="divrl.integrations.trl_data"):
        assert exploration_dataset(mixed, store)["prompt_id"] == ["q1"]
    assert "1 of the dataset's 3 prompts are not in the reference store" in caplog.text
    # the rows kept, and why the others went, in one line
    assert "DPH-RL keeps 1 of the dataset's 3 rows" in caplog.text
    assert "1 are near-perfect prompts of" in caplog.text and "1 not in it" in caplog.text


def test_a_dataset_without_ids_is_matched_by_its_prompts(tmp_path, capsys):
    from datasets import Dataset

    from divrl.data.fingerprint import prompt_key

    chat = [{"role": "user", "content": "What is 6 * 12?"}]
    prompts = ["a", chat, "c"]
    rows = [
        {"prompt_id": f"q{i}", "n_correct": n, "split": split, "has_reference": n > 0}
        for i, (n, split) in enumerate(
            [(4, "near_perfect"), (0, "exploration"), (0, "exploration")]
        )
    ]
    for row, prompt in zip(rows, prompts, strict=True):
        row["prompt_key"] = prompt_key(prompt)
    store = write_reference_store(
        tmp_path / "s",
        [ReferenceSample("q0", [1], [3], [-0.5])],
        rows,
        {"log_prob_temperature": 1.0},
    )
    # the chat prompt as TRL holds it (extra keys do not count); "d" is not in the store
    own = [{"content": "What is 6 * 12?", "role": "user", "name": None}]
    data = Dataset.from_list([{"prompt": "a"}, {"prompt": "d"}, {"prompt": "c"}])
    kept = exploration_dataset(data, store)
    assert kept["prompt_id"] == ["q2"] and kept["prompt"] == ["c"]
    err = capsys.readouterr().err
    assert "DPH-RL keeps 1 of the dataset's 3 rows" in err and "1 not in it" in err
    messages = Dataset.from_list([{"prompt": own}])
    assert exploration_dataset(messages, store)["prompt_id"] == ["q1"]
    assert prompt_key("a") != prompt_key("c") and prompt_key(chat) != prompt_key("What is 6 * 12?")


def test_trl_dataset_has_divrl_ids_and_prompts_and_the_verifier_scores_them(
    tmp_path, tokenizer, caplog
):
    rows = [
        {
            "data_source": "math",
            "prompt": f"{i}+{i}=" + "1" * (3 * i),  # the last one is too long
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": f"m{i}"},
        }
        for i in range(4)
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"1 of 4 prompts .* longer than data\.max_prompt_length"):
        trl_dataset(path, tokenizer, max_prompt_length=10)  # truncation="error", as divrl's
    with caplog.at_level(logging.INFO, logger="divrl.integrations.trl_data"):
        data = trl_dataset(path, tokenizer, max_prompt_length=10, truncation="drop")
    assert data["prompt_id"] == ["m0", "m1", "m2"]  # m3 has 13 tokens > 10
    assert "trl_dataset: 3 prompts from" in caplog.text
    assert "(1 longer than max_prompt_length=10: 1 dropped)" in caplog.text
    assert data["prompt"][1] == "1+1=111"
    assert trl_dataset(path, tokenizer, limit=2)["prompt_id"] == ["m0", "m1"]
    # a prompt that fills the model's context is refused when it loads, as divrl train does
    kept = dict(max_prompt_length=10, truncation="drop")
    with pytest.raises(ValueError, match=r"1 of the prompts in .* have 9 tokens or more"):
        trl_dataset(path, tokenizer, context=9, **kept)  # m2, "2+2=111111", has 10
    assert len(trl_dataset(path, tokenizer, context=11, **kept)) == 3
    scores = verifier_reward(
        ["so \\boxed{0}", "\\boxed{3}", [{"role": "assistant", "content": "\\boxed{4}"}]],
        data["data_source"],
        data["ground_truth"],
        data["extra_info"],
    )
    assert scores == [1.0, 0.0, 1.0]


def test_the_adapter_takes_divrl_trains_names_and_defaults(tmp_path, store):
    from divrl.algorithms import LpRegOptions
    from divrl.training.config import AlgorithmConfig

    args = make_args(tmp_path, divergence="js", reference_store=str(store))
    assert args.divergence_coef == AlgorithmConfig().divergence_coef
    assert args.policy_loss_options is None  # TRL's own loss
    options = make_args(tmp_path, policy_loss="lp_reg").policy_loss_options
    own = [n for n in LpRegOptions.names() if n not in ("clip_low", "clip_high", "agg")]
    # no copied defaults: the loss's own (the clip range and aggregation are TRL's)
    assert [getattr(options, n) for n in own] == [getattr(LpRegOptions(), n) for n in own]
    for old in ("dph_eta", "dph_divergence", "lp_reg_rho", "lp_reg_kappa", "lp_reg_beta"):
        with pytest.raises(TypeError, match=old):
            make_args(tmp_path, **{old: 0.1})


def test_trl_trainer_refuses_a_store_of_another_model(tmp_path, tokenizer, store):
    from transformers import AutoModelForCausalLM

    model_dir = tmp_path / "model"
    tiny_model(0).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    stamped = tmp_path / "stamped"
    write_reference_store(
        stamped,
        store_module.ReferenceStore(store).samples,
        [],
        {
            "log_prob_temperature": 1.0,
            "model": "/elsewhere/model",
            "fingerprint": {"model": "sha256:another"},
        },
    )

    def build(**overrides):
        return DivRLGRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir),
            reward_funcs=varied_reward,
            args=make_args(tmp_path, divergence="js", reference_store=str(stamped), **overrides),
            train_dataset=prompt_dataset(),
            processing_class=tokenizer,
        )

    with pytest.raises(StoreMismatchError, match="allow_store_mismatch=True") as err:
        build()
    assert f"model: presampled from /elsewhere/model, this run trains {model_dir}" in str(err.value)
    build(allow_store_mismatch=True)  # a warning only
    manifest = json.loads((stamped / MANIFEST).read_text())
    manifest["fingerprint"]["model"] = model_fingerprint(model_dir)
    (stamped / MANIFEST).write_text(json.dumps(manifest))
    build()  # the same model: no error
