"""The TRL adapter's Lp-Reg proxy projects a bounded number of logits at a time and gives
the values of the whole-logits functions."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

from divrl.algorithms import minp_log_normalizer, proxy_log_prob, token_log_probs
from divrl.integrations import trl_lp_reg
from divrl.integrations.trl_lp_reg import proxy_chunk_positions, proxy_from_hidden


class RecordingHead(torch.nn.Linear):
    """An LM head that records how many positions each call projects."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__(hidden, vocab, bias=False)
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.shape[0])
        return super().forward(x)


def test_the_proxy_projects_at_most_its_logit_budget_at_once(monkeypatch):
    vocab, budget = 1000, 4000
    monkeypatch.setattr(trl_lp_reg, "PROXY_CHUNK_LOGITS", budget)
    torch.manual_seed(0)
    head = RecordingHead(8, vocab)
    torch.nn.init.normal_(head.weight, std=1.5)  # peaked rows: the min-p filter drops tokens
    hidden = torch.randn(2, 9, 8)
    tokens = torch.randint(0, vocab, (2, 9))
    kappa, temperature = 0.1, 0.7
    proxy, log_z, log_prob = proxy_from_hidden(head, hidden, tokens, kappa, temperature)

    assert sum(head.calls) == 18
    assert max(head.calls) * vocab <= budget  # 4 positions (one first, for the vocabulary)
    assert max(head.calls) == proxy_chunk_positions(vocab) == 4
    with torch.no_grad():
        logits = head(hidden)
    torch.testing.assert_close(proxy, proxy_log_prob(logits, tokens, kappa, temperature))
    torch.testing.assert_close(log_z, minp_log_normalizer(logits, kappa, temperature))
    torch.testing.assert_close(log_prob, token_log_probs(logits, tokens, temperature))
    assert bool((log_z < 0).any())  # the filter dropped mass somewhere

    head.calls.clear()
    proxy_from_hidden(head, hidden, tokens, kappa, temperature, chunk=18)
    assert head.calls == [18]  # an explicit chunk is taken as it is


def test_the_proxy_budget_fits_in_trls_own_lm_head_tile():
    """A chunk's fp32 buffers (its logits, the shifted logits, their exp, the filter) stay
    within one fp32 tile of TRL's fused LM head, which runs after the proxy in the same
    forward."""
    from trl.kernels.chunked_logprob import TOKEN_CHUNK_SIZE
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    assert 4 * trl_lp_reg.PROXY_CHUNK_LOGITS <= TOKEN_CHUNK_SIZE * _CHUNKED_LOGPROB_CHUNK_SIZE
    assert proxy_chunk_positions(151_936) == 220
    assert proxy_chunk_positions(10**9) == 1
