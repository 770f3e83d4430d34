import math

import pytest
import torch

from divrl.evaluation.diversity import checkpoint_models, retention, spark_word_probability


def test_retention_counts_base_solved_prompts():
    base = [
        {"id": "a", "correct": [True, False]},
        {"id": "b", "correct": [False, True]},
        {"id": "c", "correct": [False, False]},
        {"id": "d", "correct": [True, True]},
    ]
    model = [
        {"id": "a", "correct": [True, True]},
        {"id": "b", "correct": [False, False]},
        {"id": "c", "correct": [True, True]},  # newly solved: not part of retention
    ]  # "d" missing: not retained
    assert retention(base, model) == {"base_solved": 3, "retained": 1, "retention": 1 / 3}
    assert math.isnan(retention([{"id": "x", "correct": [False]}], model)["retention"])


@torch.no_grad()
def brute_force(model, tok, prompt, response, word):
    """Per position, the word's probability token by token with one forward pass each."""
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    r = tok(response, add_special_tokens=False)["input_ids"]
    w = tok(word, add_special_tokens=False)["input_ids"]
    probs = []
    for t in range(len(r) + 1):
        ctx, prob = p + r[:t], 1.0
        for tok_id in w:
            logits = model(input_ids=torch.tensor([ctx])).logits[0, -1]
            prob *= torch.softmax(logits.float(), -1)[tok_id].item()
            ctx = [*ctx, tok_id]
        probs.append(prob)
    return sum(probs) / len(probs)


def test_spark_word_probability_matches_token_by_token(tiny_lm):
    model, tok = tiny_lm
    prompts, responses = ["Q:1+2="], ["3;4"]
    got = spark_word_probability(model, tok, prompts, responses, ["12", "7"], batch_size=3)
    assert got["12"] == pytest.approx(brute_force(model, tok, "Q:1+2=", "3;4", "12"), rel=1e-4)
    assert got["7"] == pytest.approx(brute_force(model, tok, "Q:1+2=", "3;4", "7"), rel=1e-4)
    # a single-token word: probabilities of all single characters sum to <= 1 per position
    singles = spark_word_probability(model, tok, prompts, responses, list("0123456789+=;:QA "))
    assert 0.5 < sum(singles.values()) <= 1.0 + 1e-5
    with pytest.raises(ValueError, match="one prompt per response"):
        spark_word_probability(model, tok, prompts, [], ["7"])


def test_cached_context_scoring_gives_the_separate_sequences_numbers(tiny_lm, monkeypatch):
    """The Llama path (each text run once, its keys and values cached) and the generic
    path (each position scored as its own sequence) agree, also where the context cuts a
    word's positions short and for a word that fits nowhere."""
    import divrl.rollout.static as static

    model, tok = tiny_lm
    prompts, responses = ["Q:1+2=", "Q:7+7="], ["3;4+12", "14;A:14"]
    words = ["12", "4", "A:1", "1" * 300]
    cached = spark_word_probability(model, tok, prompts, responses, words)
    calls = []
    scorer = static.word_log_probs
    monkeypatch.setattr(static, "word_log_probs", lambda *a: calls.append(a) or scorer(*a))
    assert spark_word_probability(model, tok, prompts, responses, words) == cached
    assert len(calls) == len(prompts)  # one call per text, all words in it
    monkeypatch.setattr(static, "unsupported_reason", lambda m: "not a Llama")
    separate = spark_word_probability(model, tok, prompts, responses, words, batch_size=5)
    assert math.isnan(cached["1" * 300]) and math.isnan(separate["1" * 300])
    for word in words[:3]:
        assert cached[word] == pytest.approx(separate[word], rel=1e-5)
    model.config.max_position_embeddings, saved = 10, model.config.max_position_embeddings
    try:  # "Q:1+2=" + "3;4+12" is 12 tokens: only the first positions fit
        short = spark_word_probability(model, tok, prompts[:1], responses[:1], ["12"])
        monkeypatch.undo()
        assert spark_word_probability(model, tok, prompts[:1], responses[:1], ["12"]) == (
            pytest.approx(short, rel=1e-5)
        )
    finally:
        model.config.max_position_embeddings = saved


def test_checkpoint_models_sorted(tmp_path):
    for step in (20, 5, 100):
        d = tmp_path / "checkpoints" / f"step_{step:06d}" / "model"
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    (tmp_path / "checkpoints" / ".tmp_step_000200" / "model").mkdir(parents=True)
    assert [s for s, _ in checkpoint_models(tmp_path)] == [5, 20, 100]
