"""The hf engine and divrl's vllm engine (over the CPU stand-in for vLLM's public API,
``fake_vllm``) produce the same thing for the same request.

Greedy decoding: identical token ids, texts, truncation flags and (temperature-1)
log-probs. Sampling: the same sample counts and order, the same stop and truncation rules,
log-probs at the sampling temperature; near-zero temperature: the greedy result on both.
"""

from __future__ import annotations

import inspect
import os

import fake_vllm
import pytest
import torch

from divrl.rollout import EngineContext, SamplingParams, build_engine

MAX_NEW = 40


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from divrl.toy import ensure_toy_world

    # the shipped base model (copied, not trained): it ends its answers with EOS
    return ensure_toy_world(tmp_path_factory.mktemp("toy"), size="full", progress=False)


@pytest.fixture(scope="module")
def model_and_prompts(world):
    from divrl.data import load_examples
    from divrl.evaluation.runner import load_model

    model, tok = load_model(world.model_dir)
    examples = load_examples(world.splits["test"], limit=6)
    prompts = [tok(ex.prompt, add_special_tokens=False)["input_ids"] for ex in examples]
    return model, tok, prompts


@pytest.fixture
def engines(world, model_and_prompts, monkeypatch):
    fake_vllm.install(monkeypatch)
    model, tok, prompts = model_and_prompts
    context = EngineContext(
        model_path=str(world.model_dir),
        model=model,
        tokenizer=tok,
        dtype="float32",
        max_model_len=model.config.max_position_embeddings,
    )
    hf = build_engine("hf", context, {"batch_size": 3})
    vllm = build_engine("vllm", context)
    return hf, vllm, tok, prompts


def _same(a, b):
    assert a.prompt_index == b.prompt_index
    assert a.response_ids == b.response_ids
    assert a.truncated == b.truncated
    assert a.texts == b.texts
    for x, y in zip(a.log_probs, b.log_probs, strict=True):
        assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-4)


def test_greedy_is_identical(engines):
    hf, vllm, tok, prompts = engines
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=MAX_NEW)
    a, b = hf.generate(prompts, params), vllm.generate(prompts, params)
    _same(a, b)
    ended = [not t for t in a.truncated]
    assert any(ended), "the toy model ends some answers with EOS within the limit"
    eos = tok.eos_token_id
    assert all(r[-1] == eos for r, e in zip(a.response_ids, ended, strict=True) if e)


def test_greedy_with_a_stop_string_is_identical(engines):
    hf, vllm, _, prompts = engines
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=MAX_NEW, stop=(" FROM",))
    a, b = hf.generate(prompts, params), vllm.generate(prompts, params)
    _same(a, b)
    stopped = [t.endswith(" FROM") for t in a.texts]
    assert any(stopped) and all(not t for t, s in zip(a.truncated, stopped, strict=True) if s)


def test_near_zero_temperature_sampling_is_the_greedy_result(engines):
    hf, vllm, _, prompts = engines
    greedy = hf.generate(prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=MAX_NEW))
    params = SamplingParams(n=2, temperature=1e-4, max_new_tokens=MAX_NEW)
    seeds = list(range(len(prompts)))
    for out in (hf.generate(prompts, params, seeds), vllm.generate(prompts, params, seeds)):
        assert out.prompt_index == [i for i in range(len(prompts)) for _ in range(2)]
        assert out.response_ids == [r for r in greedy.response_ids for _ in range(2)]
        assert out.truncated == [t for t in greedy.truncated for _ in range(2)]


def _check_sampling_rules(out, prompts, params, eos, context):
    """What every engine's samples obey: counts, EOS/stop endings, truncation flags."""
    assert out.prompt_index == [i for i in range(len(prompts)) for _ in range(params.n)]
    for i, ids, text, lp, cut in zip(
        out.prompt_index, out.response_ids, out.texts, out.log_probs, out.truncated, strict=True
    ):
        assert 1 <= len(ids) <= params.max_new_tokens and len(lp) == len(ids)
        assert eos not in ids[:-1]
        stops = [s for s in params.stop if s in text]
        assert all(text.endswith(s) for s in stops)  # the first stop string ends it
        ended = ids[-1] == eos or bool(stops)
        assert cut == (not ended)
        if cut:
            assert len(ids) == params.max_new_tokens or len(prompts[i]) + len(ids) == context


def test_sampling_counts_stops_and_truncation_follow_the_same_rules(engines):
    hf, vllm, tok, prompts = engines
    # COUNT(*) answers stop at the stop string, the longer WITH ... answers run to the limit
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=18, stop=("(*)",))
    seeds = [7 * i for i in range(len(prompts))]
    outs = [hf.generate(prompts, params, seeds), vllm.generate(prompts, params, seeds)]
    for out in outs:
        _check_sampling_rules(out, prompts, params, tok.eos_token_id, 128)
    for out in outs:  # both ends occur: some samples stop, some run to max_new_tokens
        assert any(out.truncated) and any(t.endswith("(*)") for t in out.texts)


def test_vllm_log_probs_are_at_the_sampling_temperature(engines, model_and_prompts):
    """As the hf engine's (and the trainer's old log-probs): log_softmax(logits / T)."""
    _, vllm, _, prompts = engines
    model = model_and_prompts[0]
    params = SamplingParams(n=2, temperature=0.7, max_new_tokens=8)
    out = vllm.generate(prompts[:2], params, seeds=[1, 2])
    for p, ids, lp in zip(out.prompt_ids, out.response_ids, out.log_probs, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([p + ids])).logits[0, len(p) - 1 : -1].float()
        ref = torch.log_softmax(logits / 0.7, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(lp), ref, atol=1e-4)


def test_vllm_seeded_samples_do_not_depend_on_batching(engines):
    _, vllm, _, prompts = engines
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=10)
    both = vllm.generate(prompts[:2], params, seeds=[5, 9])
    alone = vllm.generate(prompts[1:2], params, seeds=[9])
    assert both.response_ids[3:] == alone.response_ids


def test_vllm_weight_sync_changes_the_next_rollout(engines, world):
    from transformers import AutoModelForCausalLM

    _, vllm, _, prompts = engines
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=12)
    before = vllm.generate(prompts, params).response_ids
    policy = AutoModelForCausalLM.from_pretrained(world.model_dir)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    names = [n for n, _ in policy.named_parameters()]
    vllm.sync_weights((n, p.detach()) for n, p in policy.named_parameters())
    served = dict(vllm.llm.hf_model.named_parameters())
    assert all(torch.equal(served[n], p) for n, p in policy.named_parameters())
    assert vllm.llm.prefix_cache_resets == 1 and len(names) == len(served)
    assert vllm.generate(prompts, params).response_ids != before


def test_vllm_version_outside_the_supported_range_is_refused(monkeypatch, world):
    from divrl.rollout.vllm import VLLMEngine

    fake_vllm.install(monkeypatch, version="0.9.2")
    with pytest.raises(ImportError, match=r"vLLM 0\.9\.2 is installed.*>= 0\.20\.0, < 0\.35"):
        VLLMEngine(str(world.model_dir))
    engine = VLLMEngine(str(world.model_dir), dtype="float32", allow_untested_version=True)
    assert engine.llm.init_kwargs["logprobs_mode"] == "processed_logprobs"


def test_fake_vllm_signatures_match_vllm():
    """The stand-in's calls exist in the installed vLLM with the same parameter names."""
    vllm = pytest.importorskip("vllm")  # skipped where vLLM is not installed (CPU machines)
    pairs = [
        (fake_vllm.LLM.__init__, vllm.LLM.__init__),
        (fake_vllm.LLM.generate, vllm.LLM.generate),
        (fake_vllm.LLM.collective_rpc, vllm.LLM.collective_rpc),
    ]
    for fake, real in pairs:
        real_names = set(inspect.signature(real).parameters)
        fake_names = set(inspect.signature(fake).parameters) - {"kwargs"}
        assert fake_names <= real_names | {"priority", "lora_request"}, (fake, real_names)
    params = set(inspect.signature(vllm.SamplingParams).parameters)
    assert set(inspect.signature(fake_vllm.SamplingParams).parameters) <= params


def test_a_plain_process_gets_a_one_process_group_only_while_vllm_starts(monkeypatch, world):
    """external_launcher reads RANK / WORLD_SIZE / MASTER_PORT; left set, they would make
    accelerate believe torchrun launched the process."""
    from divrl.rollout.vllm import VLLMEngine

    fake_vllm.install(monkeypatch)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    engine = VLLMEngine(str(world.model_dir), dtype="float32")
    seen = engine.llm.env_at_init
    assert seen["RANK"] == "0" and seen["WORLD_SIZE"] == "1" and int(seen["MASTER_PORT"]) > 0
    assert "RANK" not in os.environ and "MASTER_PORT" not in os.environ
