"""The stages of a training step, each on its own: hand-checked small cases."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from train_helpers import tiny_overrides

from divrl.checkpoint.strategies import prune_checkpoints
from divrl.data.reference_store import ReferenceSample
from divrl.distributed import Collective
from divrl.rewards.types import BatchScores, ScoreRequest, ScoreResult
from divrl.rollout import collate
from divrl.runs import Checkpoint, RunDir
from divrl.training.batch import Experience, ReferenceSamples
from divrl.training.config import load_config
from divrl.training.experience import informative_groups, score_requests, shard_positions
from divrl.training.loading import pad_token_id
from divrl.training.metrics import StepMetrics
from divrl.training.trainer import Trainer
from divrl.training.update import chunks, pack_by_tokens, split

PROMPTS = [[5, 6], [7], [8, 9, 10], [11]]
RESPONSES = [[1, 2, 3], [4], [], [12, 13]]


def _experience() -> Experience:
    return Experience.from_rollouts(
        PROMPTS,
        RESPONSES,
        [[-0.1, -0.2, -0.3], [-0.4], [], [-0.5, -0.6]],
        rewards=[1.0, 0.0, 0.5, 1.0],
        scores=[1.0, 0.0, 0.5, 1.0],
        groups=[0, 0, 1, 1],
        truncated=[False, True, False, False],
        pad_id=0,
    )


@pytest.mark.parametrize("idx", [[0, 1, 2, 3], [3, 1], [2], [1, 3], [0]])
def test_micro_batch_inputs_equal_collating_the_rows(idx):
    exp = _experience()
    got = exp.model_inputs(idx)
    want = collate([PROMPTS[i] for i in idx], [RESPONSES[i] for i in idx], 0)
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key


def test_reference_samples_are_padded_once_with_their_log_probs():
    rows = [ReferenceSample(f"p{i}", p, r, [-1.0 - j for j in range(len(r))]) for i, (p, r) in
            enumerate(zip(PROMPTS, RESPONSES, strict=True))]  # fmt: skip
    samples = ReferenceSamples.from_samples(rows, pad_id=0)
    assert samples.ref_log_probs.tolist() == [
        [-1.0, -2.0, -3.0],
        [-1.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [-1.0, -2.0, 0.0],
    ]
    got = samples.model_inputs([3, 0])
    want = collate([PROMPTS[3], PROMPTS[0]], [RESPONSES[3], RESPONSES[0]], 0)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_select_and_truncate_keep_every_field_row_aligned():
    exp = _experience()
    exp.old_log_probs = torch.arange(12.0).reshape(4, 3)
    part = exp.select([3, 0])
    assert part.rewards.tolist() == [1.0, 1.0] and part.groups.tolist() == [1, 0]
    assert part.old_log_probs.tolist() == [[9.0, 10.0, 11.0], [0.0, 1.0, 2.0]]
    assert part.ref_log_probs is None
    head = exp.truncate(2)
    assert len(head) == 2 and head.truncated.tolist() == [False, True]
    assert head.rollout_log_probs[0].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert exp.response_lengths.tolist() == [3, 1, 0, 2]
    assert exp.by_length([0, 1, 2, 3]) == [1, 2, 3, 0]  # lengths 5, 2, 3, 3 (stable)


def test_shard_positions_give_each_process_its_piece_of_every_mini_batch():
    # 8 prompts, mini-batches of 4, 2 processes: rank 0 gets 0,1 and 4,5
    assert shard_positions(8, 4, 2, 0) == [0, 1, 4, 5]
    assert shard_positions(8, 4, 2, 1) == [2, 3, 6, 7]
    assert shard_positions(8, 8, 1, 0) == list(range(8))
    both = shard_positions(12, 6, 3, 0) + shard_positions(12, 6, 3, 1)
    assert sorted(both + shard_positions(12, 6, 3, 2)) == list(range(12))


def test_informative_groups():
    assert informative_groups([1, 1, 0, 1, 0.5, 0.5], 2) == [False, True, False]


def test_pack_by_tokens_fills_each_micro_batch_up_to_the_budget():
    lengths = [4, 4, 5, 9, 12, 3]
    assert pack_by_tokens([0, 1, 2, 3, 4, 5], lengths, 10) == [[0, 1], [2], [3], [4], [5]]
    assert pack_by_tokens([5, 0, 1, 2], lengths, 12) == [[5, 0, 1], [2]]
    assert pack_by_tokens([4], lengths, 5) == [[4]]  # longer than the budget: alone
    assert pack_by_tokens([], lengths, 5) == []


def test_chunks_and_split():
    assert chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert split(range(7), 3) == [[0, 1, 2], [3, 4], [5, 6]]


def test_step_metrics_reduce_as_declared():
    local = StepMetrics()
    local.put("reward/score", 0.5)
    local.put("dapo/kept_groups", 3, reduce="sum")
    local.put("loss/total", 1.25, reduce="global")
    coll = Collective(1, 0, torch.device("cpu"))
    assert local.reduced(coll) == {"dapo/kept_groups": 3.0, "loss/total": 1.25, "reward/score": 0.5}
    with pytest.raises(ValueError, match="unknown reduction"):
        local.put("x", 1.0, reduce="median")


def test_pad_token_id_falls_back_to_eos():
    assert pad_token_id(SimpleNamespace(pad_token_id=3, eos_token_id=2)) == 3
    assert pad_token_id(SimpleNamespace(pad_token_id=None, eos_token_id=2)) == 2
    with pytest.raises(ValueError, match="neither a pad token nor an eos token"):
        pad_token_id(SimpleNamespace(pad_token_id=None, eos_token_id=None))


def test_score_requests_reports_failure_reasons():
    reqs = [ScoreRequest("math", "x", "1"), ScoreRequest("math", "y", "2")]

    def typed(requests):
        return BatchScores([ScoreResult(1.0, "1", "correct"), ScoreResult(0.0, None, "timeout")])

    assert score_requests(typed, reqs) == ([1.0, 0.0], {"timeout": 1})
    assert score_requests(lambda r: [0.5, 2.0], reqs) == ([0.5, 2.0], {})
    with pytest.raises(ValueError, match="1 scores for 2"):
        score_requests(lambda r: [0.5], reqs)


def test_failure_reasons_become_reward_metrics(tiny_world, tmp_path):
    def no_answer_on_odd_lengths(requests):
        return BatchScores(
            [
                ScoreResult(0.0, None, "no_answer")
                if len(r.solution_str) % 2
                else ScoreResult(1.0, r.solution_str, "correct")
                for r in requests
            ]
        )

    cfg = load_config(None, tiny_overrides(tiny_world, tmp_path, **{"train.total_steps": 2}))
    history = Trainer(cfg, reward_fn=no_answer_on_odd_lengths).train()
    for record in history:  # 16 completions per step (4 prompts x 4)
        failed = record.get("reward/no_answer", 0.0)
        assert failed == pytest.approx(16 * (1.0 - record["reward/score"]))
    assert any("reward/no_answer" in r for r in history)


def test_run_dir_lists_checkpoints_by_step_and_prunes_the_oldest(tmp_path):
    run = RunDir(tmp_path)
    assert run.latest() is None and run.final_model() is None
    for step in (2, 10, 1):
        (run.checkpoint(step).model_dir).mkdir(parents=True)
    (run.checkpoint(2).model_dir / "config.json").write_text("{}")
    run.temp_checkpoint_path(11).mkdir()
    assert [c.step for c in run.checkpoints()] == [1, 2, 10]
    assert run.latest().step == 10
    assert run.final_model() == run.checkpoint(2).model_dir  # step 10 has no model
    assert run.checkpoint(7).path.name == "step_000007"
    for step in (1, 2, 10):  # the run's own step record: its id in each trainer state
        run.checkpoint(step).trainer_state_path.write_text(json.dumps({"run_id": "mine"}))
    other = run.checkpoint(30)  # another run's checkpoint, newer by name
    other.model_dir.mkdir(parents=True)
    other.trainer_state_path.write_text(json.dumps({"run_id": "other"}))
    prune_checkpoints(run, keep_last=2, run_id="mine")
    assert [c.step for c in run.checkpoints()] == [2, 10, 30]
    assert run.metrics_path.name == "metrics.jsonl" and run.config_path.name == "config.yaml"
    # a checkpoint given by its directory (``divrl eval <checkpoint>``)
    assert Checkpoint.at(run.checkpoint(2).path) == run.checkpoint(2)
    assert Checkpoint.at(tmp_path).step == -1 and not Checkpoint.at(tmp_path).has_model()


def test_reference_store_open_checks_what_training_needs(tmp_path):
    from divrl.data.reference_store import ReferenceSample, ReferenceStore, write_reference_store

    with pytest.raises(FileNotFoundError, match="presample"):
        ReferenceStore.open(tmp_path / "none")
    empty = write_reference_store(tmp_path / "empty", [], [], {"log_prob_temperature": 1.0})
    with pytest.raises(ValueError, match="holds no samples"):
        ReferenceStore.open(empty)
    sample = ReferenceSample("p0", [1, 2], [3], [-0.5])
    rows = [{"prompt_id": "p0", "n_correct": 4, "split": "near_perfect", "has_reference": True}]
    store = write_reference_store(tmp_path / "s", [sample], rows, {"log_prob_temperature": 1.0})
    assert len(ReferenceStore.open(store, temperature=1.0)) == 1
    with pytest.raises(ValueError, match="temperature"):
        ReferenceStore.open(store, temperature=0.7)
    assert json.loads((store / "manifest.json").read_text())["log_prob_temperature"] == 1.0


def test_the_trainer_needs_paths_and_the_command_fills_them(tmp_path):
    from divrl.commands.train import with_toy_defaults

    cfg = load_config(None, [f"logging.output_dir={tmp_path}"])
    with pytest.raises(ValueError, match=r"model\.path and data\.train_path must be set"):
        Trainer(cfg)
    given = load_config(None, ["model.path=/m", "data.train_path=/d.jsonl"])
    assert with_toy_defaults(given) is given and given.model.path == "/m"


@pytest.mark.parametrize("mode", ["error", "drop", "left"])
def test_prompts_over_max_prompt_length_follow_data_truncation(mode, tiny_world, tmp_path, caplog):
    from transformers import AutoTokenizer

    from divrl.training.loading import run_prompts

    rows = [
        {
            "data_source": "math",
            "prompt": text,
            "reward_model": {"style": "rule", "ground_truth": "1"},
            "extra_info": {"index": f"p{i}"},
        }
        for i, text in enumerate(["Q:1+2=", "Q:12345+67890=", "Q:3=", "Q:99999+99999+1="])
    ]
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = tiny_overrides(tiny_world, tmp_path, **{"data.max_prompt_length": 8})
    cfg = load_config(None, [*overrides, f"data.truncation={mode}"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_world["model"])
    if mode == "error":
        with pytest.raises(ValueError, match=r"2 of 4 prompts .* data.max_prompt_length=8"):
            run_prompts(cfg, str(data), None, tokenizer)
        return
    with caplog.at_level("INFO", logger="divrl.training.loading"):
        items, count = run_prompts(cfg, str(data), None, tokenizer)
    assert count == 2 and "2 of 4 prompts longer than" in caplog.text
    if mode == "drop":
        assert [p.id for p in items] == ["p0", "p2"]
    else:
        assert [p.id for p in items] == ["p0", "p1", "p2", "p3"]
        assert all(len(p.prompt_ids) <= 8 for p in items)
        # the last 8 tokens of "Q:12345+67890=" (one token per character)
        assert tokenizer.decode(items[1].prompt_ids) == "5+67890="
