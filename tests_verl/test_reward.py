"""divrl's verifiers as verl's reward function, through verl's own reward managers."""

from __future__ import annotations

import json
from importlib import resources

import torch
from verl import DataProto
from verl.workers.reward_manager.batch import BatchRewardManager
from verl.workers.reward_manager.naive import NaiveRewardManager

from divrl.integrations.verl.reward import compute_score, compute_score_batch
from divrl.toy.tokenizer import build_tokenizer


def _fixture(name: str) -> list[dict]:
    text = resources.files("divrl.data").joinpath("fixtures", name).read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def toy_batch(tokenizer) -> tuple[DataProto, list[float]]:
    """The math fixture's first completions (right, wrong, no answer) as a verl batch."""
    rows, completions = _fixture("math.jsonl")[:3], _fixture("math_completions.jsonl")[:3]
    prompts, responses, sources, models, extras, gold = [], [], [], [], [], []
    for row, comp in zip(rows, completions, strict=True):
        for text in comp["completions"]:
            prompts.append(tokenizer.encode(row["prompt"][0]["content"][:20]))
            responses.append(tokenizer.encode(text))
            sources.append(row["data_source"])
            models.append(row["reward_model"])
            extras.append(dict(row["extra_info"]))
            gold.append(
                compute_score(row["data_source"], text, row["reward_model"]["ground_truth"])[
                    "score"
                ]
            )
    p_len, r_len = max(map(len, prompts)), max(map(len, responses))
    pad = tokenizer.pad_token_id
    prompt_t = torch.tensor([[pad] * (p_len - len(p)) + p for p in prompts])
    resp_t = torch.tensor([r + [pad] * (r_len - len(r)) for r in responses])
    attn = torch.tensor(
        [
            [0] * (p_len - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (r_len - len(r))
            for p, r in zip(prompts, responses, strict=True)
        ]
    )
    import numpy as np

    data = DataProto.from_dict(
        tensors={"prompts": prompt_t, "responses": resp_t, "attention_mask": attn},
        non_tensors={
            "data_source": np.array(sources, dtype=object),
            "reward_model": np.array(models, dtype=object),
            "extra_info": np.array(extras, dtype=object),
        },
    )
    return data, gold


def test_the_naive_reward_manager_scores_the_toy_data_with_divrls_verifiers():
    tok = build_tokenizer()
    data, gold = toy_batch(tok)
    assert sorted(set(gold)) == [0.0, 1.0]  # right and wrong answers among them
    manager = NaiveRewardManager(tok, num_examine=0, compute_score=compute_score)
    out = manager(data, return_dict=True)
    rewards = out["reward_tensor"]
    lengths = data.batch["attention_mask"][:, data.batch["prompts"].shape[1] :].sum(-1)
    scored = [float(rewards[i, lengths[i] - 1]) for i in range(len(gold))]
    assert scored == gold
    assert out["reward_extra_info"]["acc"] == [float(g >= 1.0) for g in gold]


def test_the_batch_reward_manager_scores_in_divrls_pool():
    tok = build_tokenizer()
    data, gold = toy_batch(tok)
    manager = BatchRewardManager(tok, num_examine=0, compute_score=compute_score_batch)
    rewards = manager(data, return_dict=True)["reward_tensor"]
    assert [float(v) for v in rewards.sum(-1)] == gold


def test_verls_extra_info_keys_are_ignored():
    out = compute_score("math", "so \\boxed{4}", "4", {"num_turns": 2, "rollout_reward_scores": {}})
    assert out == {"score": 1.0, "acc": 1.0, "unscorable": 0.0}


def test_the_reward_loop_manager_of_verls_v1_trainer_scores_concurrently():
    """verl's v1 trainer scores through its reward loop, which calls the function from
    executor threads, several rows at once."""
    import asyncio

    from omegaconf import OmegaConf
    from verl.experimental.reward_loop.reward_manager.naive import (
        NaiveRewardManager as LoopManager,
    )

    tok = build_tokenizer()
    data, gold = toy_batch(tok)

    async def score_all():
        manager = LoopManager(OmegaConf.create({}), tok, compute_score)
        results = await asyncio.gather(
            *(manager.run_single(data[i : i + 1]) for i in range(len(gold)))
        )
        return [r["reward_score"] for r in results], [
            r["reward_extra_info"]["acc"] for r in results
        ]

    scores, acc = asyncio.run(score_all())
    assert scores == gold and acc == [float(g >= 1.0) for g in gold]
