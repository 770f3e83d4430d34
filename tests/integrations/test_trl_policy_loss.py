"""Any registered policy loss in TRL's GRPOTrainer, by what its options declare: a loss
registered here runs (its value and gradient equal its own function on the same tensors);
one needing what TRL lacks is refused at config validation with one line; ``lp_reg=True``
is the older spelling of ``policy_loss="lp_reg"``; the adapter reads no loss by name."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from trl_helpers import make_args, prompt_dataset, tiny_model, tiny_tokenizer, varied_reward

pytest.importorskip("trl")

from divrl.algorithms import (
    POLICY_LOSS_OPTIONS,
    POLICY_LOSSES,
    aggregate,
    minp_log_normalizer,
    policy_loss_spec,
    proxy_log_prob,
)
from divrl.algorithms.loss_options import LossOptions
from divrl.algorithms.options import option
from divrl.algorithms.policy_loss import clipped_surrogate
from divrl.integrations.trl import DivRLGRPOTrainer

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
NAME = "entropy_weighted_test"


@dataclass(frozen=True)
class EntropyWeightedOptions(LossOptions):
    LOSS: ClassVar[str] = NAME
    INPUTS: ClassVar[tuple[str, ...]] = ("entropy", "token_weights")
    clip_low: float = option(0.2, "ratio clip below", 0.0, 1.0)
    clip_high: float = option(0.2, "ratio clip above", 0.0)
    agg: str = option("token-mean", "aggregation")
    gamma: float = option(0.0, "extra weight per nat of entropy", 0.0)


def entropy_weighted(
    log_prob,
    old_log_prob,
    advantages,
    mask,
    entropy=None,
    token_weights=None,
    clip_low=0.2,
    clip_high=0.2,
    agg="token-mean",
    gamma=0.0,
):
    """The clipped surrogate, each token's term times ``1 + gamma * entropy``."""
    loss_mat, _ = clipped_surrogate(log_prob, old_log_prob, advantages, mask, clip_low, clip_high)
    loss_mat = loss_mat * (1.0 + gamma * entropy)
    if token_weights is not None:
        loss_mat = loss_mat * token_weights
    loss = aggregate(loss_mat, mask, agg)
    return loss, {"entropy_weighted/loss": float(loss.detach())}


@dataclass(frozen=True)
class RefLogProbOptions(LossOptions):
    LOSS: ClassVar[str] = "ref_user_test"
    INPUTS: ClassVar[tuple[str, ...]] = ("ref_log_prob",)
    agg: str = option("token-mean", "aggregation")


@dataclass(frozen=True)
class FullLogitsOptions(LossOptions):
    LOSS: ClassVar[str] = "full_logits_test"
    agg: str = option("token-mean", "aggregation")

    @property
    def needs_full_logits(self) -> bool:
        return True


@pytest.fixture
def registered():
    added = {NAME: EntropyWeightedOptions}
    added |= {o.LOSS: o for o in (RefLogProbOptions, FullLogitsOptions)}
    for name, options in added.items():
        POLICY_LOSSES.register(name)(entropy_weighted)
        POLICY_LOSS_OPTIONS[name] = options
    yield
    for name in added:
        del POLICY_LOSSES[name], POLICY_LOSS_OPTIONS[name]


def build(args):
    return DivRLGRPOTrainer(
        model=tiny_model(0),
        reward_funcs=varied_reward,
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tiny_tokenizer(),
    )


def batch_and_loss(trainer, seed: int = 3):
    """One generation batch (2 prompts) through TRL, and the adapter's loss on it (bnpo,
    GA 1: TRL's reduction is divrl's token-mean) with its gradients."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(seed)
    rows = [{"prompt": p} for p in ("1+2=", "3+4=") for _ in range(trainer.args.num_generations)]
    batch = trainer._generate_and_score_completions(rows)
    trainer.model.zero_grad()
    torch.manual_seed(seed)  # a loss drawing random tokens (clip_cov) draws the same ones
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    return batch, loss, [p.grad.clone() for p in trainer.model.parameters()]


def plain_forward(model, batch):
    """Logits of the completion tokens from a plain forward (eval mode: HF skips the
    gradient checkpointing TRL turns on; dropout is off), their log-probs and entropies."""
    model.eval()
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    k = batch["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=attention).logits[:, -(k + 1) : -1].float()
    lp = logits.log_softmax(-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    return logits, lp, entropy


#: options (by name, for the losses declaring them) that make a loss acting on a share of
#: tokens (Lp-Reg's selection, Clip-Cov's cut) act on some of the tiny batch's
SELECT_MORE = {"rho": 0.5, "min_k": 1, "clip_ratio": 0.5, "clip_cov_lb": -100.0}


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_registered_loss_runs_and_equals_its_own_function(tmp_path, name):
    """Each loss of the registry, as registered: off-policy (TRL's old log-probs, then the
    weights moved, so r != 1), TRL's loss with the adapter and its gradient equal the loss's
    function on a plain forward's tensors (the inputs its options declare; the proxy of pi_old), with TRL's
    clip range and bnpo's token-mean."""
    more = {k: v for k, v in SELECT_MORE.items() if k in POLICY_LOSS_OPTIONS[name].names()}
    args = make_args(
        tmp_path, policy_loss=name, loss_type="bnpo", num_iterations=2, loss_options=more
    )
    trainer = build(args)
    options = trainer.args.policy_loss_options
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(3)
    rows = [{"prompt": p} for p in ("1+2=", "3+4=") for _ in range(args.num_generations)]
    batch = trainer._generate_and_score_completions(rows)
    kappa = getattr(options, "kappa", 0.0)
    model = trainer.model
    with torch.no_grad():
        old_logits, _, _ = plain_forward(model, batch)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.train()
    model.zero_grad()
    torch.manual_seed(5)  # a loss drawing random tokens (clip_cov) draws the same ones
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    _, lp, entropy = plain_forward(model, batch)
    available = {
        "entropy": entropy.detach(),
        "proxy_log_prob": proxy_log_prob(old_logits, batch["completion_ids"], kappa),
        "log_normalizer": minp_log_normalizer(old_logits, kappa),
    }
    torch.manual_seed(5)
    expected, _ = policy_loss_spec(name).fn(
        log_prob=lp,
        old_log_prob=batch["old_per_token_logps"],
        advantages=batch["advantages"],
        mask=batch["completion_mask"],
        **options.loss_kwargs(),
        **{k: available[k] for k in options.INPUTS if k in available},
    )
    assert float(loss) == pytest.approx(float(expected), abs=1e-6)
    expected.backward()  # the gradient too (clip_cov changes only the gradient)
    for g, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)


def test_a_registered_loss_runs_and_equals_its_own_function(registered, tmp_path):
    """A loss registered in this file: TRL's loss with the adapter is its function on the
    log-probs and entropies of a plain logits forward (value and gradient), then one
    train() step runs and logs the loss's metrics."""
    args = make_args(tmp_path, policy_loss=NAME, loss_type="bnpo", loss_options={"gamma": 0.5})
    assert args.loss_options == {"gamma": 0.5}  # the clip range and agg are TRL's
    trainer = build(args)
    batch, loss, grads = batch_and_loss(trainer)
    model = trainer.model
    _, lp, entropy = plain_forward(model, batch)
    mask = batch["completion_mask"]
    expected, _ = entropy_weighted(
        lp, lp.detach(), batch["advantages"], mask, entropy=entropy.detach(), gamma=0.5
    )
    assert float(loss) == pytest.approx(float(expected), abs=1e-6)
    # gamma matters here: the plain clipped surrogate differs
    plain, _ = entropy_weighted(lp, lp.detach(), batch["advantages"], mask, entropy=entropy)
    assert abs(float(plain) - float(expected)) > 1e-4
    model.zero_grad()
    expected.backward()
    for g, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)
    model.train()

    trainer = build(make_args(tmp_path, policy_loss=NAME, max_steps=1))
    trainer.train()
    logged = trainer.state.log_history[0]
    assert "divrl/entropy_weighted/loss" in logged and f"divrl/{NAME}/replacement" in logged


def test_a_loss_needing_what_trl_lacks_is_refused_naming_it(registered, tmp_path):
    with pytest.raises(ValueError, match=r"takes \['ref_log_prob'\], which TRL's GRPOTrainer"):
        make_args(tmp_path, policy_loss="ref_user_test")
    with pytest.raises(ValueError, match="full-vocabulary logits of every position"):
        make_args(tmp_path, policy_loss="full_logits_test")
    with pytest.raises(ValueError, match="policy_loss='nope': use one of"):
        make_args(tmp_path, policy_loss="nope")
    # TRL's vLLM weights need a loss that takes token_weights (the plain gspo takes none)
    with pytest.raises(ValueError, match="'gspo' takes no token_weights"):
        make_args(tmp_path, policy_loss="gspo", use_vllm=True)
    with pytest.raises(ValueError, match="needs a clipped-surrogate loss_type"):
        make_args(tmp_path, policy_loss=NAME, loss_type="sapo")
    with pytest.raises(ValueError, match=r"through TRL's \['epsilon_high'\]"):
        make_args(tmp_path, policy_loss=NAME, loss_options={"clip_high": 0.3})
    args = make_args(tmp_path, policy_loss=NAME, use_vllm=True, epsilon_high=0.28)
    assert (args.policy_loss_options.clip_low, args.policy_loss_options.clip_high) == (0.2, 0.28)


def test_lp_reg_true_is_the_older_spelling_of_policy_loss_lp_reg(tmp_path):
    old = make_args(tmp_path, lp_reg=True, loss_options={"rho": 0.3})
    new = make_args(tmp_path, policy_loss="lp_reg", loss_options={"rho": 0.3})
    assert old.policy_loss == "lp_reg" and old.policy_loss_options == new.policy_loss_options
    assert make_args(tmp_path, lp_reg=True, policy_loss="lp_reg").policy_loss == "lp_reg"
    with pytest.raises(ValueError, match="policy_loss='gspo' disagree: drop lp_reg"):
        make_args(tmp_path, lp_reg=True, policy_loss="gspo")
    assert make_args(tmp_path).policy_loss_options is None  # TRL's own loss


def test_the_adapter_reads_no_loss_by_name():
    """Neither a comparison with a registered loss's name nor an attribute named after one
    (``args.lp_reg``) in the adapter's modules: it asks the options what the loss needs."""
    found = []
    for path in sorted((ROOT / "divrl" / "integrations").glob("trl*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = set()
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                names |= {s.value for s in sides if isinstance(s, ast.Constant)}
            if names & set(POLICY_LOSSES):
                found.append(f"{path.name}:{node.lineno}")
    assert not found, found
