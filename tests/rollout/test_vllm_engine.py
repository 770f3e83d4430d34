"""The vLLM engine against a stand-in ``vllm`` module (vLLM itself needs a GPU).

This checks what divrl sends to vLLM's documented API (``LLM(...)``, ``SamplingParams``,
``TokensPrompt``, ``RequestOutput.outputs[i].token_ids / logprobs / text /
finish_reason``) and how it reads the results back, not vLLM itself.
"""

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from divrl.rollout import SamplingParams


@pytest.fixture
def fake_vllm(monkeypatch):
    calls = {}

    class FakeSamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class FakeLLM:
        def __init__(self, **kwargs):
            calls["llm"] = kwargs
            self.loaded = []
            self.reset = 0

        def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            calls["rpc"] = method
            (weights,) = args
            self.loaded.extend(weights)
            return [len(self.loaded)]

        def generate(self, prompts, sampling, use_tqdm=True):
            calls["generate"] = (prompts, sampling)
            outs = []
            for i, p in enumerate(prompts):
                toks = [p["prompt_token_ids"][-1] + 1, 7]
                completion = SimpleNamespace(
                    token_ids=toks,
                    text=f"r{i}",
                    logprobs=[
                        {t: SimpleNamespace(logprob=-0.5 * (k + 1))} for k, t in enumerate(toks)
                    ],
                    finish_reason="length" if i else "stop",
                )
                outs.append(SimpleNamespace(outputs=[completion, completion]))
            return outs

        def reset_prefix_cache(self):
            self.reset += 1

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = FakeLLM, FakeSamplingParams
    vllm.__version__ = "0.34.0"
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    return calls


def test_vllm_engine_maps_the_api(fake_vllm):
    from divrl.rollout.vllm import VLLMEngine

    engine = VLLMEngine("some/model", gpu_memory_utilization=0.25, dtype="bfloat16", seed=3)
    assert fake_vllm["llm"]["model"] == "some/model"
    assert fake_vllm["llm"]["gpu_memory_utilization"] == 0.25
    assert fake_vllm["llm"]["distributed_executor_backend"] == "external_launcher"
    assert fake_vllm["llm"]["logprobs_mode"] == "processed_logprobs"
    assert fake_vllm["llm"]["worker_extension_cls"] == "divrl.rollout.vllm.WeightSyncExtension"
    params = SamplingParams(
        n=2, temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=5, stop=("</a>",)
    )
    out = engine.generate([[1, 2], [5]], params, seeds=[10, 11])
    prompts, sampling = fake_vllm["generate"]
    assert prompts == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [5]}]
    kw = [s.kwargs for s in sampling]
    assert [k["seed"] for k in kw] == [10, 11]
    assert kw[0]["n"] == 2 and kw[0]["logprobs"] == 0 and kw[0]["top_k"] == -1
    assert kw[0]["max_tokens"] == 5 and kw[0]["stop"] == ["</a>"]
    assert kw[0]["temperature"] == 0.7 and kw[0]["top_p"] == 0.9
    assert out.prompt_index == [0, 0, 1, 1]
    assert out.response_ids[0] == [3, 7] and out.response_ids[2] == [6, 7]
    assert out.log_probs[0] == [-0.5, -1.0]
    assert out.truncated == [False, False, True, True]
    assert out.texts == ["r0", "r0", "r1", "r1"]

    model = torch.nn.Linear(2, 2)
    engine.sync_weights((name, p.detach()) for name, p in model.named_parameters())
    assert fake_vllm["rpc"] == "divrl_load_weights"
    assert [name for name, _ in engine.llm.loaded] == ["weight", "bias"]
    assert engine.llm.reset == 1
