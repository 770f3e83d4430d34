import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from divrl.rollout import HFEngine, SamplingParams, collate, pad_token_id
from divrl.rollout.hf import response_length
from divrl.training.forward import batch_log_probs


def _decode(tokens):
    return "".join({1: "a", 2: "b", 3: ";", 4: "c", 9: "<eos>"}[t] for t in tokens)


def test_response_length_eos_and_stop_strings():
    assert response_length([1, 2, 9, 1], {9}, (), _decode) == (3, True)
    assert response_length([1, 2, 1, 1], {9}, (), _decode) == (4, False)
    # the stop string ends the response at its last character, before a later EOS
    assert response_length([1, 3, 2, 9], {9}, (";",), _decode) == (2, True)
    # a multi-token stop string
    assert response_length([1, 2, 4, 1, 2], {9}, ("bc",), _decode) == (3, True)
    # a stop string that only appears after EOS does not count
    assert response_length([1, 9, 3], {9}, (";",), _decode) == (2, True)


def test_collate_layout():
    b = collate([[5, 6], [7]], [[1, 2, 3], [4]], pad_token_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 1, 2, 3], [0, 7, 4, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 0, 1, 1, 1]]
    assert b["responses"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert b["response_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_pad_token_id_is_the_one_fallback():
    """Pad token, else EOS (the first of a list); the engine pads with the same id."""
    assert pad_token_id(SimpleNamespace(pad_token_id=0, eos_token_id=2)) == 0
    assert pad_token_id(SimpleNamespace(pad_token_id=None, eos_token_id=[7, 2])) == 7
    no_pad = SimpleNamespace(pad_token_id=None, eos_token_id=9)
    assert pad_token_id(no_pad) == 9
    assert HFEngine(None, no_pad).pad_id == 9
    with pytest.raises(ValueError, match="neither a pad token nor an eos token"):
        pad_token_id(SimpleNamespace(pad_token_id=None, eos_token_id=[]))


def test_sampling_params_validate():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="n and max_new_tokens"):
        SamplingParams(n=0)


def _prompts(tok):
    return [
        tok("Q:1+2=", add_special_tokens=False)["input_ids"],
        tok("Q:12+3=", add_special_tokens=False)["input_ids"],
    ]


def test_generate_shapes_and_log_probs_match_a_forward_pass(tiny_lm):
    model, tok = tiny_lm
    engine = HFEngine(model, tok, batch_size=2)
    prompts = _prompts(tok)
    params = SamplingParams(n=3, temperature=0.8, max_new_tokens=7)
    torch.manual_seed(0)
    out = engine.generate(prompts, params)
    assert len(out) == 6
    assert out.prompt_index == [0, 0, 0, 1, 1, 1]
    assert out.prompt_ids[4] == prompts[1]
    for ids, lps, text, trunc in zip(
        out.response_ids, out.log_probs, out.texts, out.truncated, strict=True
    ):
        assert 1 <= len(ids) <= 7 and len(lps) == len(ids)
        assert text == tok.decode(ids, skip_special_tokens=True)
        assert trunc == (tok.eos_token_id not in ids)
    # the engine's log-probs (from generate's logits, left-padded batch, KV cache) equal a
    # teacher-forced forward at the same temperature
    ref = batch_log_probs(
        model, out.prompt_ids, out.response_ids, pad_token_id=0, temperature=0.8, micro_batch_size=4
    )
    for a, b in zip(out.log_probs, ref, strict=True):
        assert a == pytest.approx(b, abs=1e-4)
    assert all(lp <= 0 for row in out.log_probs for lp in row)
    model.train()
    engine.generate(prompts[:1], SamplingParams(max_new_tokens=2))
    assert model.training  # generation runs in eval mode and restores the caller's mode


def test_seeded_generation_is_independent_of_batching(tiny_lm):
    model, tok = tiny_lm
    engine = HFEngine(model, tok)
    prompts = _prompts(tok)
    params = SamplingParams(n=4, max_new_tokens=8)
    both = engine.generate(prompts, params, seeds=[11, 22])
    second = engine.generate(prompts[1:], params, seeds=[22])
    assert both.response_ids[4:] == second.response_ids
    other = engine.generate(prompts[1:], params, seeds=[23])
    assert other.response_ids != second.response_ids
    # the caller's RNG stream is untouched by seeded generation
    torch.manual_seed(5)
    engine.generate(prompts, params, seeds=[1, 2])
    after = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(1))


def test_stop_strings_end_the_response(tiny_lm):
    model, tok = tiny_lm
    engine = HFEngine(model, tok)
    prompt = _prompts(tok)[:1]
    params = SamplingParams(n=1, max_new_tokens=10)
    free = engine.generate(prompt, params, seeds=[3])
    text = free.texts[0]
    assert len(text) >= 3
    stop = text[2]
    cut = engine.generate(prompt, SamplingParams(n=1, max_new_tokens=10, stop=(stop,)), seeds=[3])
    assert cut.texts[0] == text[: text.index(stop) + 1]
    assert not cut.truncated[0]


def test_importing_divrl_does_not_import_vllm():
    code = (
        "import sys, divrl, divrl.rollout, divrl.training.trainer, divrl.rollout.vllm\n"
        "assert 'vllm' not in sys.modules, 'vllm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_responses_end_at_the_model_context_per_prompt(tiny_lm, monkeypatch, caplog):
    model, tok = tiny_lm
    prompts = _prompts(tok)  # 6 and 7 tokens
    engine = HFEngine(model, tok, batch_size=2)
    free = engine.generate(prompts[:1], SamplingParams(n=2, max_new_tokens=20), seeds=[7])
    monkeypatch.setattr(model.config, "max_position_embeddings", 12)
    assert engine.context_length == 12
    seeded = engine.generate(prompts[:1], SamplingParams(n=2, max_new_tokens=20), seeds=[7])
    for full, cut, trunc in zip(
        free.response_ids, seeded.response_ids, seeded.truncated, strict=True
    ):
        assert cut == full[:6]  # the same samples, ended where the context ends
        assert trunc == (tok.eos_token_id not in cut)
    # in one left-padded batch each prompt keeps its own room: 6 and 5 new tokens
    with caplog.at_level("WARNING", logger="divrl.rollout.hf"):
        out = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=20))
    lengths = {
        i: [len(r) for r, p in zip(out.response_ids, out.prompt_index, strict=True) if p == i]
        for i in (0, 1)
    }
    assert max(lengths[0]) == 6 and max(lengths[1]) == 5
    capped = sum(t for t in out.truncated)
    assert capped > 0 and engine.context_capped >= capped
    assert "reached the model's context of 12 tokens" in caplog.text
    # responses that fit are not touched, and a prompt that fills the context is refused
    before = engine.context_capped
    fits = engine.generate(prompts[:1], SamplingParams(n=2, max_new_tokens=6), seeds=[7])
    assert fits.response_ids == seeded.response_ids and engine.context_capped == before
    monkeypatch.setattr(model.config, "max_position_embeddings", 7)
    with pytest.raises(ValueError, match="leaves no room in the model's context of 7 tokens"):
        engine.generate(prompts, SamplingParams(max_new_tokens=2))
