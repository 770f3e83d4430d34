"""Samples cut at the model's context are flagged, counted in the summary and named in the
report (the hf engine ends them there; see tests/rollout/test_hf_engine.py)."""

from divrl.data import fixture_path, load_examples, render_prompt
from divrl.evaluation.runner import EvalConfig, generate_samples, score_samples
from divrl.evaluation.summary import summarise


def test_samples_at_the_context_are_flagged_and_counted(tiny_lm, monkeypatch):
    model, tok = tiny_lm
    examples = load_examples(fixture_path("math.jsonl"), limit=2)
    lengths = [
        len(tok(render_prompt(ex, tokenizer=tok), add_special_tokens=False)["input_ids"])
        for ex in examples
    ]
    # room for 4 new tokens after the longer prompt, 4 + the difference after the shorter
    monkeypatch.setattr(model.config, "max_position_embeddings", max(lengths) + 4)
    cfg = EvalConfig(n=3, max_new_tokens=30, batch_size=2, greedy=False)
    records = generate_samples(model, tok, examples, cfg, progress=False)
    for rec, length in zip(records, lengths, strict=True):
        for smp in rec["samples"]:
            assert length + smp["n_tokens"] <= max(lengths) + 4
            assert smp["at_context"] == (
                smp["truncated"] and length + smp["n_tokens"] == max(lengths) + 4
            )
    flagged = [smp["at_context"] for rec in records for smp in rec["samples"]]
    assert any(flagged)  # a random tiny model rarely ends within 4 tokens
    summary = summarise(score_samples(records, cfg, progress=False), cfg)
    assert summary["tokens"]["at_context_share"] == sum(flagged) / len(flagged)
    # nothing is flagged when every response fits
    monkeypatch.setattr(model.config, "max_position_embeddings", 1000)
    records = generate_samples(model, tok, examples, cfg, progress=False)
    assert not any(smp["at_context"] for rec in records for smp in rec["samples"])
