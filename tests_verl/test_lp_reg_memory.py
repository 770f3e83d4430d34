"""Lp-Reg's proxy in verl's logits hook: chunked over tokens, in the engine's dtype, and
under Megatron's logits-processor call (its ``data_format=`` argument, TP/CP refused)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from divrl.algorithms import logit_stats
from divrl.integrations.verl.keys import LOG_NORMALIZER, PROXY_LOG_PROB
from divrl.integrations.verl.losses import DivRLLoss
from divrl.integrations.verl.lp_reg_proxy import (
    CHUNK_SHARE,
    auto_chunk_rows,
    minp_proxy,
    next_token_labels,
)
from divrl.integrations.verl.settings import DivRLVerlSettings
from tests_verl.builders import micro_batches, rollout_rows
from tests_verl.test_losses import actor_config

LP_REG = DivRLVerlSettings(policy_loss="lp_reg", loss_options={"kappa": 0.05})


def _logits(rows: int, vocab: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=g) * 3.0).to(dtype)


@pytest.mark.parametrize("kappa", [0.0, 0.02, 0.3])
def test_chunked_proxy_equals_the_unchunked_one_and_divrls(kappa):
    logits = _logits(37, 300)
    labels = torch.randint(0, 300, (37,), generator=torch.Generator().manual_seed(1))
    whole = minp_proxy(logits, labels, kappa, chunk_rows=37)
    for rows in (1, 5, 36, None):
        for got, want in zip(
            minp_proxy(logits, labels, kappa, chunk_rows=rows), whole, strict=True
        ):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # divrl train's one-pass computation on the same logits
    stats = logit_stats(logits, labels, 1.0, with_entropy=False, minp_kappa=kappa)
    torch.testing.assert_close(whole[0], stats.proxy_log_prob, rtol=0, atol=1e-6)
    torch.testing.assert_close(whole[1], stats.log_normalizer, rtol=0, atol=1e-6)
    assert bool((whole[0] < -1e30).any()) == (kappa > 0)  # some labels filtered out


def test_tempered_logits_filter_on_the_untempered_probabilities():
    raw, t = _logits(20, 200, seed=2), 0.6
    labels = torch.randint(0, 200, (20,), generator=torch.Generator().manual_seed(3))
    proxy, log_z = minp_proxy(raw / t, labels, 0.1, temperature=t, chunk_rows=3)
    stats = logit_stats(raw, labels, t, with_entropy=False, minp_kappa=0.1)
    torch.testing.assert_close(proxy, stats.proxy_log_prob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(log_z, stats.log_normalizer, rtol=1e-5, atol=1e-5)


def _storage(t) -> int | None:
    """The address of a plain tensor's memory (None for anything else)."""
    if not isinstance(t, torch.Tensor) or t.is_nested or t.layout != torch.strided:
        return None
    return t.untyped_storage().data_ptr()


class _FloatBuffers(TorchDispatchMode):
    """The element counts of every new floating-point tensor an op returns (views and
    in-place results, which share an input's storage, are not new memory)."""

    def __init__(self):
        super().__init__()
        self.sizes: list[tuple[torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage(a) for a in [*args, *(kwargs or {}).values()]}
        for t in out if isinstance(out, (tuple, list)) else [out]:
            new = _storage(t) not in inputs
            if isinstance(t, torch.Tensor) and t.is_floating_point() and new:
                self.sizes.append((t.dtype, t.numel()))
        return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_hook_never_allocates_a_tokens_by_vocab_fp32_copy(dtype):
    (micro,) = micro_batches(rollout_rows(40, seed=4, vocab=2000), 40)
    nnz = micro["input_ids"].values().shape[0]
    vocab = 2000
    logits = _logits(nnz, vocab, seed=5, dtype=dtype).unsqueeze(0)
    loss_fn = DivRLLoss(actor_config(), LP_REG)
    with _FloatBuffers() as seen:
        out = loss_fn(student_logits=logits, data=micro)
    chunk = auto_chunk_rows(nnz, logits.element_size())
    assert chunk < nnz // 8  # the test runs several chunks
    biggest = max(n for d, n in seen.sizes if d == torch.float32)
    assert biggest <= chunk * vocab  # one chunk's rows, never all positions x vocab
    # the chunk's fp32 buffer and mask are a small share of the logits' own memory
    assert biggest * 5 <= CHUNK_SHARE * logits.numel() * logits.element_size()
    proxy, log_z = minp_proxy(
        logits[0], next_token_labels(logits, micro["input_ids"], None)[0], 0.05
    )
    torch.testing.assert_close(out[PROXY_LOG_PROB][0], proxy, rtol=0, atol=0)
    torch.testing.assert_close(out[LOG_NORMALIZER][0], log_z, rtol=0, atol=0)


# ---------------------------------------------------------------- Megatron's call


@pytest.fixture
def megatron_groups(monkeypatch):
    """A stand-in for ``megatron.core.parallel_state`` (Megatron is not installed here):
    sets the tensor- and context-parallel sizes the hook reads."""
    sizes = {"tp": 1, "cp": 1}
    state = types.ModuleType("megatron.core.parallel_state")
    state.get_tensor_model_parallel_world_size = lambda: sizes["tp"]
    state.get_context_parallel_world_size = lambda: sizes["cp"]
    core = types.ModuleType("megatron.core")
    core.parallel_state = state
    root = types.ModuleType("megatron")
    root.core = core
    for name, module in (
        ("megatron", root),
        ("megatron.core", core),
        ("megatron.core.parallel_state", state),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    return sizes


def _megatron_call(loss_fn, logits, micro, data_format):
    """What verl's Megatron engine does in ``_lm_head_logits_processor``."""
    return loss_fn(student_logits=logits, data=micro, data_format=data_format)


def test_megatron_thd_call_gives_the_fsdp_proxy(megatron_groups):
    (micro,) = micro_batches(rollout_rows(5, seed=6), 5)
    packed = _logits(micro["input_ids"].values().shape[0], 50, seed=7).unsqueeze(0)
    loss_fn = DivRLLoss(actor_config(), LP_REG)
    fsdp = loss_fn(student_logits=packed, data=micro)
    thd = _megatron_call(loss_fn, packed, micro, "thd")
    for key in (PROXY_LOG_PROB, LOG_NORMALIZER):
        assert thd[key].shape == packed.shape[:2]
        torch.testing.assert_close(thd[key], fsdp[key], rtol=0, atol=0)


def test_megatron_bshd_call_lays_the_proxy_out_per_row(megatron_groups):
    (micro,) = micro_batches(rollout_rows(5, seed=8), 5)
    ids = micro["input_ids"]
    lengths = ids.offsets().diff().tolist()
    packed = _logits(sum(lengths), 50, seed=9)
    width = max(lengths) + 3  # verl pads bshd rows to an aligned length
    bshd = torch.full((len(lengths), width, 50), -5.0)
    starts = ids.offsets().tolist()
    for i, n in enumerate(lengths):
        bshd[i, :n] = packed[starts[i] : starts[i] + n]
    loss_fn = DivRLLoss(actor_config(), LP_REG)
    fsdp = loss_fn(student_logits=packed.unsqueeze(0), data=micro)
    out = _megatron_call(loss_fn, bshd, micro, "bshd")
    for key in (PROXY_LOG_PROB, LOG_NORMALIZER):
        assert out[key].shape == (len(lengths), width)
        for i, n in enumerate(lengths):  # every position that predicts a token of its row
            want = fsdp[key][0, starts[i] : starts[i] + n - 1]
            torch.testing.assert_close(out[key][i, : n - 1], want, rtol=0, atol=0)


@pytest.mark.parametrize(("tp", "cp"), [(2, 1), (1, 2)])
def test_megatron_tensor_or_context_parallel_is_refused(megatron_groups, tp, cp):
    megatron_groups.update(tp=tp, cp=cp)
    (micro,) = micro_batches(rollout_rows(2, seed=10), 2)
    logits = _logits(micro["input_ids"].values().shape[0], 50).unsqueeze(0)
    loss_fn = DivRLLoss(actor_config(), LP_REG)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=1 and context_parallel"):
        _megatron_call(loss_fn, logits, micro, "thd")


def test_megatron_actor_split_over_the_vocabulary_is_refused_at_startup():
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    config = omega_conf_to_dataclass(
        OmegaConf.create(
            {
                "_target_": "verl.workers.config.McoreActorConfig",
                "strategy": "megatron",
                "ppo_mini_batch_size": 4,
                "ppo_micro_batch_size_per_gpu": 2,
                "rollout_n": 1,
                "megatron": {
                    "_target_": "verl.workers.config.McoreEngineConfig",
                    "tensor_model_parallel_size": 4,
                },
            }
        )
    )
    with pytest.raises(ValueError, match=r"got TP=4, CP=1"):
        DivRLLoss(config, LP_REG)
    DivRLLoss(config, DivRLVerlSettings())  # GRPO needs no proxy: accepted
