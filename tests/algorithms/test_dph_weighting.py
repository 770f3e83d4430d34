"""DPH stream weighting: hand-checked weights, and gradients equal to each weighting's formula."""

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from divrl.algorithms import divergence_generator, policy_loss, reference_divergence_loss
from divrl.algorithms.dph_weighting import (
    AuthorsLayout,
    authors_effective_eta,
    micro_batch_weights,
    references_under_policy_loss,
    stream_weights,
)
from divrl.algorithms.policy_loss import clipped_surrogate

R, F = "rollout", "reference"
# the scripts' step: 128 prompts x 16 rollouts + 256 reference samples, 2 mini-batches, 8 GPUs
FORWARD_KL = AuthorsLayout(2048, 256, 2, gpus=8, micro_batch_size=2, dynamic=False)
JS = AuthorsLayout(2048, 256, 2, gpus=8, dynamic=True)


def test_weights_by_hand():
    kinds, tokens, eta = [R, R, F], [3, 5, 4], 0.5
    # 4 rollouts and 2 reference samples on one GPU, no mixing: eta_a = eta * 2 / 4
    layout = AuthorsLayout(4, 2, 1, gpus=1, micro_batch_size=2)
    assert micro_batch_weights(kinds, tokens, eta, "authors", layout=layout) == pytest.approx(
        [3 / 8, 5 / 8, 0.25]
    )
    assert micro_batch_weights(kinds, tokens, eta, "paper") == pytest.approx([3 / 8, 5 / 8, 0.5])
    assert micro_batch_weights(kinds, tokens, eta, "concat") == pytest.approx(
        [3 / 12, 5 / 12, 0.5 * 4 / 12]
    )
    assert micro_batch_weights(kinds, tokens, eta, "paper", token_mean=False) == pytest.approx(
        [0.5, 0.5, 0.5]
    )
    authors = stream_weights(kinds, tokens, eta, "authors", layout=layout)
    assert authors.effective_eta == pytest.approx(0.25)
    assert stream_weights(kinds, tokens, eta, "paper").effective_eta == pytest.approx(0.5)
    assert stream_weights(kinds, tokens, eta, "concat").effective_eta == pytest.approx(0.25)


def test_the_scripts_layouts():
    # forward_kl.sh: GPU 7 holds rollouts 2016-2047 and all 256 reference samples; its first
    # mini-batch is 32 rollouts + 96 reference samples, cut into pairs: no pair mixes kinds
    assert (FORWARD_KL.rows_per_gpu, FORWARD_KL.mini_batch_rows) == (288, 128)
    assert references_under_policy_loss(FORWARD_KL) == 0
    assert authors_effective_eta(0.01, FORWARD_KL) == pytest.approx(0.01 / 8)
    # js_kl.sh / alpha.sh: token-balanced micro-batches of that mini-batch each start with a
    # rollout, so its 96 reference samples get the policy loss: 160 / 2048
    assert references_under_policy_loss(JS) == 96
    assert authors_effective_eta(0.2, JS) == pytest.approx(0.2 * 0.078125)
    # the toy scale keeps the ratios (256 rollouts, 32 reference samples)
    toy = AuthorsLayout(256, 32, 2, gpus=8, dynamic=True)
    assert references_under_policy_loss(toy) == 12
    assert authors_effective_eta(1.0, toy) == pytest.approx(0.078125)


def test_misrouted_reference_samples_by_hand():
    # 10 rollouts + 2 reference rows on 2 GPUs (6 rows each), mini-batches of 5 rows: GPU 1
    # holds rollouts 6-9 and both reference rows: mini-batch [r r r r f], [f]
    assert references_under_policy_loss(AuthorsLayout(10, 2, 1, gpus=2, dynamic=True)) == 1
    # micro-batches of 3: [r r r] [r f] -> one reference row under the policy loss
    fixed3 = AuthorsLayout(10, 2, 1, gpus=2, micro_batch_size=3)
    assert references_under_policy_loss(fixed3) == 1
    # micro-batches of 2: [r r] [r r] [f]: none
    assert references_under_policy_loss(AuthorsLayout(10, 2, 1, gpus=2)) == 0
    # reference rows starting a GPU's chunk mix with nothing
    assert references_under_policy_loss(AuthorsLayout(8, 8, 1, gpus=2, dynamic=True)) == 0


def test_uneven_layouts_are_cut_as_torch_chunk():
    # 10 rollouts + 3 reference rows on 2 GPUs: chunks of 7 and 6 (their trainer would
    # refuse the sizes); mini-batches of 5: GPU 1 holds rollouts 7-9 and 3 reference rows
    layout = AuthorsLayout(10, 3, 1, gpus=2, dynamic=True)
    assert not layout.even and (layout.rows_per_gpu, layout.mini_batch_rows) == (7, 5)
    assert references_under_policy_loss(layout) == 2  # [r r r f f], [f]
    assert FORWARD_KL.even and JS.even


def test_invalid_layouts():
    with pytest.raises(ValueError, match="rollouts must be >= 1"):
        AuthorsLayout(0, 8, 1)
    with pytest.raises(ValueError, match="references must be >= 0"):
        AuthorsLayout(8, -1, 1)


def test_authors_needs_a_layout():
    with pytest.raises(ValueError, match="pass layout"):
        micro_batch_weights([R, F], [1, 1], 0.1, "authors")


def test_effective_eta_is_zero_without_one_of_the_streams():
    assert stream_weights([R, R], [3, 4], 0.2, layout=JS).effective_eta == 0.0
    assert stream_weights([F], [3], 0.2, layout=JS).effective_eta == 0.0


@pytest.mark.parametrize(
    ("kinds", "tokens", "mode", "message"),
    [
        ([R], [1], "mean", "unknown divergence weighting 'mean'"),
        ([R, "ref"], [1, 1], "paper", "kinds must be"),
        ([R], [1, 2], "paper", "1 kinds but 2 token counts"),
    ],
)
def test_invalid_inputs(kinds, tokens, mode, message):
    with pytest.raises(ValueError, match=message):
        micro_batch_weights(kinds, tokens, 0.1, mode)


def test_concat_needs_token_mean():
    with pytest.raises(ValueError, match="token-mean"):
        micro_batch_weights([R, F], [1, 1], 0.1, "concat", token_mean=False)


# ----------------------------------------------------------------- gradients on a tiny model

VOCAB, HIDDEN, LENGTH, ETA = 11, 6, 5, 0.3


def _tiny_step(seed=0):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, HIDDEN), torch.nn.Linear(HIDDEN, VOCAB))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))

    def batch(n):
        tokens = torch.randint(0, VOCAB, (n, LENGTH), generator=g)
        lengths = torch.randint(1, LENGTH + 1, (n,), generator=g)  # unequal token counts
        mask = (torch.arange(LENGTH) < lengths.unsqueeze(1)).float()
        shift = 0.5 * torch.randn(n, LENGTH, generator=g)  # old / ref differ from current
        return tokens, mask, shift

    rollouts, references = batch(6), batch(2)
    advantages = torch.randn(6, generator=g)
    return model, rollouts, references, advantages


def _log_probs(model, tokens):
    return torch.log_softmax(model(tokens), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _grads(model, loss):
    model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.flatten().clone() for p in model.parameters()])


# the tiny step's layout in the authors' trainer: 6 rollouts + 2 reference rows, one GPU
TINY = AuthorsLayout(6, 2, 1, gpus=1, micro_batch_size=2)


def _divrl_step(model, rollouts, references, advantages, mode, micro=2, by_sequences=False):
    """divrl's way: pure micro-batches, each aggregated on its own, weighted (by token or,
    for the per-micro-batch token-mean, by sequence counts)."""
    (rt, rm, rs), (ft, fm, fs) = rollouts, references
    jobs = [(R, slice(i, i + micro)) for i in range(0, len(rt), micro)]
    jobs += [(F, slice(i, i + micro)) for i in range(0, len(ft), micro)]
    if by_sequences:
        counts = [len(range(len(rt if k == R else ft))[s]) for k, s in jobs]
    else:
        counts = [int((rm if k == R else fm)[s].sum()) for k, s in jobs]
    weights = micro_batch_weights([k for k, _ in jobs], counts, ETA, mode, layout=TINY)
    model.zero_grad()
    for (kind, s), w in zip(jobs, weights, strict=True):
        if kind == R:
            lp = _log_probs(model, rt[s])
            old = (lp + rs[s]).detach()
            loss, _ = policy_loss(lp, old, advantages[s], rm[s], 0.2, 0.28)
        else:
            lp = _log_probs(model, ft[s])
            loss, _ = reference_divergence_loss(lp, (lp + fs[s]).detach(), fm[s], "js")
        (loss * w).backward()
    return torch.cat([p.grad.flatten().clone() for p in model.parameters()])


def test_authors_weighting_equals_the_authors_actor_loop():
    model, rollouts, references, advantages = _tiny_step()
    # divrl's `authors` with the per-micro-batch token-mean (micro-batches weighed by their
    # share of the stream's sequences)
    ours = _divrl_step(model, rollouts, references, advantages, "authors", by_sequences=True)
    # The authors' actor on one GPU: rollouts, then the reference samples, with a type tag;
    # mini-batches of 6 rows (all the rollouts), split into micro-batches of 2;
    # a micro-batch typed reference (by its first sample) gets eta * token-mean divergence,
    # otherwise the token-mean clipped loss; every micro-batch is divided by the
    # accumulation count 6 / 2 = 3. The second mini-batch (the 2 reference rows) is a step
    # of its own; its gradient, at the same parameters, is added here.
    (rt, rm, rs), (ft, fm, fs) = rollouts, references
    tokens, mask, shift = torch.cat([rt, ft]), torch.cat([rm, fm]), torch.cat([rs, fs])
    kind = torch.tensor([1] * len(rt) + [2] * len(ft))
    adv = torch.cat([advantages, torch.zeros(len(ft))])
    accumulation = 6 // 2
    model.zero_grad()
    for i in range(0, len(tokens), 2):
        s = slice(i, i + 2)
        lp = _log_probs(model, tokens[s])
        other = (lp + shift[s]).detach()
        if kind[s][0] == 2:
            f = divergence_generator("js")(lp - other)
            loss = ETA * (f * mask[s]).sum() / mask[s].sum()
        else:
            ratio = torch.exp(lp - other)
            a = adv[s].unsqueeze(1)
            per_token = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.28))
            loss = (per_token * mask[s]).sum() / mask[s].sum()
        (loss / accumulation).backward()
    theirs = torch.cat([p.grad.flatten().clone() for p in model.parameters()])
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=0)
    assert ours.abs().max() > 1e-3  # a real gradient, not two zeros


def test_authors_weighting_is_paper_with_the_authors_eta():
    model, rollouts, references, advantages = _tiny_step(4)
    ours = _divrl_step(model, rollouts, references, advantages, "authors")
    pg, rm, div, fm = _per_token_losses(model, rollouts, references, advantages)
    eta = authors_effective_eta(ETA, TINY)
    assert eta == pytest.approx(ETA * 2 / 6)
    loss = (pg * rm).sum() / rm.sum() + eta * (div * fm).sum() / fm.sum()
    assert torch.allclose(ours, _grads(model, loss), atol=1e-6, rtol=0)


def _per_token_losses(model, rollouts, references, advantages):
    (rt, rm, rs), (ft, fm, fs) = rollouts, references
    lp = _log_probs(model, rt)
    pg, _ = clipped_surrogate(lp, (lp + rs).detach(), advantages, rm, 0.2, 0.28)
    lp_ref = _log_probs(model, ft)
    div = divergence_generator("js")(lp_ref - (lp_ref + fs).detach())
    return pg, rm, div, fm


def test_paper_weighting_is_two_whole_stream_token_means():
    model, rollouts, references, advantages = _tiny_step(1)
    ours = _divrl_step(model, rollouts, references, advantages, "paper")
    pg, rm, div, fm = _per_token_losses(model, rollouts, references, advantages)
    loss = (pg * rm).sum() / rm.sum() + ETA * (div * fm).sum() / fm.sum()
    assert torch.allclose(ours, _grads(model, loss), atol=1e-6, rtol=0)


def test_concat_weighting_is_one_token_mean_over_both_streams():
    model, rollouts, references, advantages = _tiny_step(2)
    ours = _divrl_step(model, rollouts, references, advantages, "concat")
    pg, rm, div, fm = _per_token_losses(model, rollouts, references, advantages)
    loss = ((pg * rm).sum() + ETA * (div * fm).sum()) / (rm.sum() + fm.sum())
    assert torch.allclose(ours, _grads(model, loss), atol=1e-6, rtol=0)


def test_the_three_weightings_differ_on_this_step():
    model, rollouts, references, advantages = _tiny_step(3)
    grads = {
        m: _divrl_step(model, rollouts, references, advantages, m)
        for m in ("authors", "paper", "concat")
    }
    assert not torch.allclose(grads["authors"], grads["paper"], atol=1e-4)
    assert not torch.allclose(grads["authors"], grads["concat"], atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([R, F]), st.integers(1, 50)), min_size=1, max_size=12),
    st.floats(0.0, 2.0),
)
def test_stream_totals(jobs, eta):
    kinds, counts = [k for k, _ in jobs], [n for _, n in jobs]
    n_r, n_f = kinds.count(R), kinds.count(F)
    # paper: each present stream sums to 1 (times eta for the reference one)
    paper = stream_weights(kinds, counts, eta, "paper")
    assert paper.rollout == pytest.approx(1.0 if n_r else 0.0)
    assert paper.reference == pytest.approx(eta if n_f else 0.0)
    # concat: token shares of one token-mean
    concat = stream_weights(kinds, counts, eta, "concat")
    tok_r = sum(n for k, n in jobs if k == R)
    assert concat.rollout == pytest.approx(tok_r / sum(counts))
    # authors: paper with the layout's eta
    authors = stream_weights(kinds, counts, eta, "authors", layout=FORWARD_KL)
    assert authors.rollout == pytest.approx(1.0 if n_r else 0.0)
    assert authors.reference == pytest.approx(eta / 8 if n_f else 0.0)
    if n_r and n_f:
        assert authors.effective_eta == pytest.approx(eta / 8)
