"""Typed policy-loss options: declared per loss, validated once, refused where inapplicable."""

import ast
import dataclasses
import inspect

import pytest
import torch

from divrl.algorithms import (
    POLICY_LOSS_OPTIONS,
    POLICY_LOSSES,
    GSPOOptions,
    gspo_loss,
    kl_estimate,
    policy_loss_options,
    policy_loss_spec,
    reference_divergence_loss,
)
from divrl.algorithms._utils import k3
from divrl.algorithms.lp_reg import lp_reg_loss


def test_every_loss_declares_options_matching_its_signature():
    assert set(POLICY_LOSS_OPTIONS) == set(POLICY_LOSSES)
    for name, fn in POLICY_LOSSES.items():
        options = POLICY_LOSS_OPTIONS[name]
        params = inspect.signature(fn).parameters
        for f in dataclasses.fields(options):
            if f.name in options.NOT_LOSS_ARGS:
                continue
            # every option reaches the loss, with the same default (one source of truth)
            assert f.name in params, (name, f.name)
            assert params[f.name].default == f.default, (name, f.name)
        assert options().loss_kwargs().keys() <= params.keys()


def test_gspo_gets_its_own_clip_range_and_aggregation():
    opts = policy_loss_options("gspo")
    assert (opts.clip_low, opts.clip_high, opts.agg) == (3e-4, 4e-4, "seq-mean-token-mean")
    # the options reach the loss: a ratio of 1.001 on one sequence is clipped at 1 + 4e-4
    lp = torch.tensor([[0.001, 0.001], [0.0, 0.0]], requires_grad=True)
    old = torch.zeros(2, 2)
    adv = torch.tensor([1.0, 1.0])
    mask = torch.ones(2, 2)
    loss, metrics = gspo_loss(lp, old, adv, mask, **opts.loss_kwargs())
    assert metrics["pg/clip_frac"] == pytest.approx(0.5)
    # seq-mean-token-mean of -A * clip(s): sequence 0 clipped to 1.0004, sequence 1 at 1
    assert float(loss.detach()) == pytest.approx(-(1.0004 + 1.0) / 2, abs=1e-6)
    loss.backward()
    assert torch.all(lp.grad[0] == 0) and torch.all(lp.grad[1] != 0)


def test_unknown_option_names_the_loss_and_its_options():
    with pytest.raises(ValueError, match=r"'gspo' has no option 'rho'.*clip_low, clip_high, agg"):
        policy_loss_options("gspo", rho=0.1)
    with pytest.raises(ValueError, match="unknown policy loss 'nope'"):
        policy_loss_options("nope")


def _declaring(option: str, declared: bool = True) -> list[str]:
    """The registered losses whose options declare ``option`` (or do not)."""
    names = [
        name
        for name, opts in sorted(POLICY_LOSS_OPTIONS.items())
        if (option in {f.name for f in dataclasses.fields(opts)}) == declared
    ]
    assert names, f"no registered loss {'declares' if declared else 'lacks'} {option}"
    return names


@pytest.mark.parametrize("name", _declaring("dual_clip", declared=False))
def test_dual_clip_is_refused_with_the_reason(name):
    with pytest.raises(ValueError, match=rf"{name!r} does not take 'dual_clip': .*its options"):
        policy_loss_options(name, dual_clip=3.0)


def test_kl_cov_refuses_a_clip_range():
    with pytest.raises(ValueError, match="does not clip the ratio"):
        policy_loss_options("kl_cov", clip_high=0.28)


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        ("vanilla", {"clip_low": -0.1}, r"clip_low=-0.1 must be in \[0, 1\]"),
        ("vanilla", {"dual_clip": 1.0}, "dual_clip=1.0 must be > 1"),
        ("vanilla", {"agg": "mean"}, "agg='mean' is not an aggregation mode"),
        ("lp_reg", {"kappa": 1.5}, r"kappa=1.5 must be in \[0, 1\]"),
        ("lp_reg", {"min_k": 0}, r"min_k=0 must be in \[1, inf\]"),
        ("high_entropy", {"top_fraction": 0.0}, r"top_fraction=0.0 must be in \(0, 1\]"),
        ("clip_cov", {"clip_cov_lb": 5.0}, "clip_cov_lb=5.0 must be below clip_cov_ub=5.0"),
    ],
)
def test_bounds_are_checked_once_at_construction(name, overrides, message):
    with pytest.raises(ValueError, match=message):
        policy_loss_options(name, **overrides)


def test_lp_reg_kappa_is_an_option_but_not_a_loss_argument():
    opts = policy_loss_options("lp_reg", kappa=0.05)
    assert opts.kappa == 0.05 and "kappa" not in opts.loss_kwargs()
    assert policy_loss_spec("lp_reg").fn is lp_reg_loss


def _dual_clip_case():
    # token 0: A < 0 and r = e^2 ~ 7.39, so -A r = 7.39 > -A c = 3 is dual-clipped to 3.
    lp = torch.tensor([[2.0, 0.0]], requires_grad=True)
    return lp, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2)


@pytest.mark.parametrize("name", _declaring("dual_clip"))
def test_dual_clip_works_where_declared(name):
    lp, old, adv, mask = _dual_clip_case()
    fields = {f.name for f in dataclasses.fields(POLICY_LOSS_OPTIONS[name])}
    more = {"top_fraction": 1.0} if "top_fraction" in fields else {}  # every token kept
    opts = policy_loss_options(name, dual_clip=3.0, **more)
    # the inputs it declares, alike on both tokens (token_weights: its default, none)
    extra = {k: torch.ones(1, 2) for k in type(opts).INPUTS if k != "token_weights"}
    fn = POLICY_LOSSES[name]
    loss, metrics = fn(lp, old, adv, mask, **extra, **opts.loss_kwargs())
    # token 0: min(max(7.39, 1.2), 3) = 3; token 1: r = 1, loss 1; token-mean = 2
    assert float(loss) == pytest.approx(2.0)
    assert metrics["pg/dual_clip_frac"] == pytest.approx(0.5)
    loss_off, _ = fn(lp, old, adv, mask, **extra, **{**opts.loss_kwargs(), "dual_clip": None})
    assert float(loss_off) == pytest.approx((torch.exp(torch.tensor(2.0)).item() + 1.0) / 2)


def test_options_are_frozen():
    opts = GSPOOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.clip_low = 0.2


def test_one_k3_serves_reverse_kl_forward_kl_and_lp_reg():
    d = torch.tensor([[-30.0, -1.0, 0.0, 0.5, 3.0, 30.0]])
    # exp(d) - d - 1 with d clamped to [-20, 20] and the value to [-10, 10]
    e = torch.e
    by_hand = torch.tensor([[10.0, e**-1.0, 0.0, e**0.5 - 1.5, 10.0, 10.0]])
    assert torch.allclose(k3(d), by_hand, atol=1e-6)
    # reverse-KL estimator: k3(ref - lp); forward-KL generator: k3(lp - ref)
    lp, ref = torch.zeros_like(d), d
    assert torch.equal(kl_estimate(lp, ref, "k3"), k3(d))
    fwd, _ = reference_divergence_loss(d, torch.zeros_like(d), torch.ones_like(d), "forward_kl")
    assert float(fwd) == pytest.approx(float(k3(d).mean()))
    # Lp-Reg's penalty on a regularised token is beta * k3(proxy - lp)
    lp_tok = torch.tensor([[-3.0, -0.1]])
    proxy = torch.tensor([[-1.0, -0.1]])
    _, metrics = lp_reg_loss(
        lp_tok, lp_tok, proxy, torch.tensor([-1.0]), torch.ones(1, 2), rho=1.0, min_k=1
    )
    assert metrics["lp_reg/penalty"] == pytest.approx(float(k3(torch.tensor(2.0))))


#: files that may compare a configured loss with a loss's name, and why
NAME_CHECKS_ALLOWED = {
    # the DPH-RL authors' batch assembly reproduces their runs, which used the vanilla loss
    "divrl/training/authors_config.py": "the authors' own setting",
}


def _string_constants(node) -> set[str]:
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def _mentions_loss(node, any_case: bool = False) -> bool:
    name = getattr(node, "attr", None) or getattr(node, "id", None) or ""
    return "loss" in (name.lower() if any_case else name)


def loss_name_checks(source: str, losses: set[str]) -> list[int]:
    """Lines of ``source`` that compare a loss setting with a registered loss's name
    (``policy_loss == "lp_reg"``, ``loss in ("vanilla", "lp_reg")``, or against a
    module-level tuple of names), or keep their own list of loss names (a constant named
    ``*loss*`` whose strings are all registered losses)."""
    tree = ast.parse(source)
    constants = {}
    found = []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            values = _string_constants(node.value)
            for target in targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = values
                    if _mentions_loss(target, any_case=True) and values and values <= losses:
                        found.append(node.lineno)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        values = set().union(*(_string_constants(s) for s in sides))
        values |= {v for s in sides if isinstance(s, ast.Name) for v in constants.get(s.id, ())}
        if any(_mentions_loss(s) for s in sides) and values & losses:
            found.append(node.lineno)
    return found


def test_the_name_check_finds_comparisons_and_lists_of_loss_names():
    losses = {"vanilla", "lp_reg"}
    assert loss_name_checks('if s.policy_loss == "lp_reg": pass', losses) == [1]
    assert loss_name_checks('x = settings.policy_loss in ("vanilla", "lp_reg")', losses) == [1]
    assert loss_name_checks('POLICY_LOSSES = ("vanilla", "lp_reg")', losses) == [1]
    names = 'MODES = ("lp_reg",)\nok = self.policy_loss not in MODES'
    assert loss_name_checks(names, losses) == [2]
    # verl's own loss modes (a list that is not divrl's losses) and capability checks pass
    assert loss_name_checks('LOSS_MODES = ("vanilla", "sapo")', losses) == []
    assert loss_name_checks("if options.NEEDS_PROXY: pass", losses) == []


def test_trainers_branch_on_declared_needs_not_on_loss_names():
    """No ``policy_loss == "lp_reg"`` (or any registered loss's name, or a list of them)
    outside the losses' own modules, the verl plugin included: a trainer asks the options
    what the loss needs (NEEDS_PROXY, ...)."""
    from pathlib import Path

    from divrl.algorithms import POLICY_LOSSES

    root = Path(__file__).resolve().parents[2]
    found = []
    for path in sorted((root / "divrl").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("divrl/algorithms/") or any(
            rel.startswith(a) for a in NAME_CHECKS_ALLOWED
        ):
            continue
        found += [f"{rel}:{n}" for n in loss_name_checks(path.read_text(), set(POLICY_LOSSES))]
    assert not found, found
