"""The static-cache engine returns what the hf engine returns: the same greedy tokens on the
shipped toy model and on random Llama / Qwen2 models, log-probs equal to a teacher-forced
forward, the same stop-string and truncation behaviour, reproducible seeded samples, and
the same results under torchrun with 2 processes (FSDP-sharded model), and samples that
follow the tempered nucleus distribution (both engines)."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from static_worker import PARAMS, TOY_PROMPTS

from divrl.rollout import HFEngine, SamplingParams
from divrl.rollout.static import StaticCacheEngine, unsupported_reason
from divrl.training.forward import batch_log_probs

WORKER = Path(__file__).parent / "static_worker.py"


@pytest.fixture(scope="module")
def toy():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from divrl.toy.world import PRETRAINED_DIR

    model = AutoModelForCausalLM.from_pretrained(PRETRAINED_DIR).eval()
    tok = AutoTokenizer.from_pretrained(PRETRAINED_DIR)
    return model, tok, [tok(p, add_special_tokens=False)["input_ids"] for p in TOY_PROMPTS]


class _Tok:
    """Ids in, text out: what the engines need of a tokenizer."""

    eos_token_id = 2
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i < 3))


def _random_model(kind: str, vocab_size: int = 97, initializer_range: float = 0.3):
    """A small random model of a real architecture, grouped-query heads (2 per key head),
    by default with weights spread wide enough that the greedy token is never a near tie."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),  # q/k/v biases
    }[kind]
    config = config_cls(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        initializer_range=initializer_range, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = model_cls(config).eval()
    if kind == "qwen2":  # non-zero biases, so that a dropped bias would show
        for layer in model.model.layers:
            torch.nn.init.normal_(layer.self_attn.q_proj.bias, std=0.3)
            torch.nn.init.normal_(layer.self_attn.k_proj.bias, std=0.3)
    return model


def _prompts(vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 12, (count,), generator=g).tolist()
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _same_greedy(model, tok, prompts, max_new_tokens, stop=()):
    """Greedy responses of both engines, asserted equal; the static engine's."""
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens, stop=stop)
    ref = HFEngine(model, tok, batch_size=len(prompts)).generate(prompts, params)
    out = StaticCacheEngine(model, tok, batch_size=len(prompts)).generate(prompts, params)
    assert out.response_ids == ref.response_ids
    assert out.texts == ref.texts and out.truncated == ref.truncated
    for a, b in zip(out.log_probs, ref.log_probs, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    return out


def test_greedy_equals_hf_on_the_shipped_toy_model(toy):
    model, tok, prompts = toy
    out = _same_greedy(model, tok, prompts, max_new_tokens=60)
    assert not all(out.truncated)  # some responses end with EOS, at different lengths
    assert len({len(r) for r in out.response_ids}) > 1


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_equals_hf_on_random_models(kind):
    out = _same_greedy(_random_model(kind), _Tok(), _prompts(97, 6), max_new_tokens=24)
    assert any(2 in r for r in out.response_ids)  # some end early: the batch is compacted


def test_stop_strings_and_truncation_as_hf(toy):
    model, tok, prompts = toy
    free = _same_greedy(model, tok, prompts, max_new_tokens=60)
    stops = ("WHERE", "b.id")  # one token; several tokens
    cut = _same_greedy(model, tok, prompts, max_new_tokens=60, stop=stops)
    for full, text, ended in zip(free.texts, cut.texts, cut.truncated, strict=True):
        assert full.startswith(text) and not ended
        assert (text != full) == any(s in full for s in stops)
    assert sum("WHERE" in t for t in cut.texts) >= 2 and any("b.id" in t for t in cut.texts)
    short = _same_greedy(model, tok, prompts, max_new_tokens=5)
    assert all(short.truncated) and all(len(r) == 5 for r in short.response_ids)


def test_sampled_log_probs_equal_a_teacher_forced_forward(toy):
    model, tok, prompts = toy
    engine = StaticCacheEngine(model, tok, batch_size=3)
    for params in (
        SamplingParams(n=3, temperature=0.7, max_new_tokens=40),
        SamplingParams(n=3, temperature=1.3, top_p=0.8, top_k=5, max_new_tokens=40),
    ):
        out = engine.generate(prompts, params, seeds=[1, 2, 3, 4, 5])
        ref = batch_log_probs(
            model, out.prompt_ids, out.response_ids, pad_token_id=tok.pad_token_id,
            temperature=params.temperature, micro_batch_size=8,
        )  # fmt: skip
        for a, b in zip(out.log_probs, ref, strict=True):
            assert a == pytest.approx(b, abs=1e-5)


def test_top_k_and_top_p_keep_only_their_tokens():
    model, tok = _random_model("llama"), _Tok()
    prompt = _prompts(97, 1)
    engine = StaticCacheEngine(model, tok)
    greedy = engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=12))
    for params in (SamplingParams(n=6, top_k=1, max_new_tokens=12),
                   SamplingParams(n=6, top_p=1e-6, max_new_tokens=12)):  # fmt: skip
        out = engine.generate(prompt, params, seeds=[4])
        assert all(r == greedy.response_ids[0] for r in out.response_ids)
    wide = engine.generate(prompt, SamplingParams(n=6, max_new_tokens=12), seeds=[4])
    assert len({tuple(r) for r in wide.response_ids}) > 1


def _processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampler must draw from: tempered softmax, then the top-p nucleus
    (a token is kept while the mass before it is below top_p), renormalised."""
    probs = torch.softmax(logits.float() / params.temperature, -1)
    if params.top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        dropped = order[(sorted_p.cumsum(0) - sorted_p) >= params.top_p]
        probs[dropped] = 0.0
        probs = probs / probs.sum()
    return probs


def _total_variation(tokens: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(tokens), minlength=probs.numel()).float()
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


@pytest.mark.parametrize("engine_cls", [StaticCacheEngine, HFEngine])
def test_samples_follow_the_tempered_nucleus_distribution(engine_cls):
    # 20,000 draws over a 20-token vocabulary: sampling noise puts the total variation near
    # 0.01 (first token) and 0.03 (second token, ~4,000 draws after the commonest first
    # token); the controls below show that a wrong temperature or an ignored top-p lands far
    # outside the bound (measured: 0.010-0.011 and 0.013-0.014; controls 0.11 and 0.081).
    model, prompt = _random_model("llama", vocab_size=20, initializer_range=0.1), [5, 7, 9, 11]
    params = SamplingParams(n=20_000, temperature=0.7, top_p=0.9, max_new_tokens=2)
    out = engine_cls(model, _Tok(), batch_size=512).generate([prompt], params, seeds=[7])
    first = [r[0] for r in out.response_ids]
    common = max(set(first), key=first.count)
    second = [r[1] for r in out.response_ids if r[0] == common and len(r) > 1]
    with torch.no_grad():
        logits_1 = model(torch.tensor([prompt])).logits[0, -1]
        logits_2 = model(torch.tensor([[*prompt, common]])).logits[0, -1]
    assert _total_variation(first, _processed_probs(logits_1, params)) < 0.025
    assert _total_variation(second, _processed_probs(logits_2, params)) < 0.06
    for wrong in (SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=0.7)):
        assert _total_variation(first, _processed_probs(logits_1, wrong)) > 0.05


def test_fixed_seeds_reproduce_independent_of_batching(toy):
    model, tok, prompts = toy
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=40)
    one = StaticCacheEngine(model, tok, batch_size=5).generate(prompts, params, seeds=[7] * 5)
    again = StaticCacheEngine(model, tok, batch_size=5).generate(prompts, params, seeds=[7] * 5)
    assert one.response_ids == again.response_ids and one.log_probs == again.log_probs
    alone = StaticCacheEngine(model, tok, batch_size=1).generate(prompts[2:3], params, seeds=[7])
    assert alone.response_ids == one.response_ids[8:12]
    other = StaticCacheEngine(model, tok).generate(prompts[2:3], params, seeds=[8])
    assert other.response_ids != alone.response_ids
    torch.manual_seed(5)  # seeded generation leaves the caller's RNG stream alone
    StaticCacheEngine(model, tok).generate(prompts, params, seeds=[1] * 5)
    after = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(1))


def test_unseeded_sampling_follows_the_global_seed(toy):
    model, tok, prompts = toy
    engine = StaticCacheEngine(model, tok, batch_size=2)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=30)
    torch.manual_seed(3)
    first = engine.generate(prompts, params)
    torch.manual_seed(3)
    assert engine.generate(prompts, params).response_ids == first.response_ids


def test_responses_end_at_the_model_context_as_hf(toy, monkeypatch):
    model, tok, prompts = toy
    monkeypatch.setattr(model.config, "max_position_embeddings", len(max(prompts, key=len)) + 4)
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=30)
    out = _same_greedy(model, tok, prompts, max_new_tokens=30)
    assert all(len(p) + len(r) <= model.config.max_position_embeddings
               for p, r in zip(out.prompt_ids, out.response_ids, strict=True))  # fmt: skip
    assert StaticCacheEngine(model, tok).generate(prompts, params).truncated == out.truncated


def test_unsupported_models_are_refused_with_the_fix():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    assert "gpt2" in unsupported_reason(gpt2)
    with pytest.raises(ValueError, match=r"rollout\.engine=hf"):
        StaticCacheEngine(gpt2, _Tok())
    assert unsupported_reason(_random_model("qwen2")) is None


@pytest.mark.slow
def test_two_processes_under_fsdp_match_one(tmp_path, run_in_session):
    """Each rank samples its share of the prompts with its seeds, from an FSDP-sharded
    model whose full weights the engine gathers; the rows equal one unsharded process's."""
    from divrl.toy.world import PRETRAINED_DIR

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = run_in_session(
        [*cmd, str(WORKER), str(tmp_path), str(PRETRAINED_DIR)], env=env, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(PRETRAINED_DIR).eval()
    tok = AutoTokenizer.from_pretrained(PRETRAINED_DIR)
    engine = StaticCacheEngine(model, tok, batch_size=8)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in TOY_PROMPTS]
    seeds = list(range(len(prompts)))
    for name, params in PARAMS.items():
        single = engine.generate(prompts, params, seeds=seeds)
        for rank in range(2):
            got = json.loads((tmp_path / f"{name}_rank{rank}.json").read_text())
            rows = [j for j, p in enumerate(single.prompt_index) if p % 2 == rank]
            assert got["response_ids"] == [single.response_ids[j] for j in rows]
            for a, j in zip(got["log_probs"], rows, strict=True):
                assert a == pytest.approx(single.log_probs[j], abs=1e-5)


def test_registered_as_static_with_its_options():
    from divrl.rollout import EngineContext, EngineError, build_engine, engine_names

    assert {"hf", "static"} <= set(engine_names())
    model = _random_model("llama")
    context = EngineContext(model_path="", model=model, tokenizer=_Tok())
    engine = build_engine("static", context, {"batch_size": 3})
    assert isinstance(engine, StaticCacheEngine) and engine.batch_size == 3
    assert engine.batched_seeds
    with pytest.raises(EngineError, match="batch_size=0 must be >= 1"):
        build_engine("static", context, {"batch_size": 0})
    with pytest.raises(ValueError, match="policy loaded in this process"):
        build_engine("static", EngineContext(model_path="x"))


def test_auto_is_static_for_a_supported_cpu_policy_else_hf():
    from transformers import GPT2Config, GPT2LMHeadModel

    from divrl.rollout import EngineContext, build_engine

    llama = EngineContext(model_path="", model=_random_model("llama"), tokenizer=_Tok())
    engine = build_engine("auto", llama, {"batch_size": 5})
    assert type(engine) is StaticCacheEngine and engine.batch_size == 5
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    other = build_engine("auto", EngineContext(model_path="", model=gpt2, tokenizer=_Tok()))
    assert type(other) is HFEngine and other.batch_size == 64
