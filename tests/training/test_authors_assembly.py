"""``train.batch_assembly: authors`` against a separate re-implementation of the DPH-RL
authors' arithmetic, written here from their code (seamoke/DPH-RL ``dp_actor.py``
update_policy, ``core_algos.py`` compute_policy_loss / js_low_var / agg_loss, the
``DataProto.chunk`` split over GPUs): the gradient of every optimiser step, with fixed and
with dynamic batch sizes; and the schedule at the scripts' scale."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from train_helpers import run_torchrun, sevens_reward, tiny_overrides

from divrl.algorithms import entropy_from_logits, token_log_probs
from divrl.algorithms.dph_weighting import AuthorsLayout, references_under_policy_loss
from divrl.training.authors_assembly import karmarkar_karp, schedule
from divrl.training.config import ConfigError, load_config
from divrl.training.forward import response_logits
from divrl.training.metrics import MetricMeter
from divrl.training.trainer import Trainer

ETA, CLIP, DUAL = 0.3, 0.2, 3.0


# ------------------------------------------------------------------ partition and schedule


def test_karmarkar_karp_partitions_and_balances():
    lengths = [9, 1, 7, 3, 5, 5, 2, 8]
    parts = karmarkar_karp(lengths, 3)
    assert sorted(i for p in parts for i in p) == list(range(8))
    assert all(p == sorted(p) and p for p in parts)
    sums = [sum(lengths[i] for i in p) for p in parts]
    assert sums == sorted(sums, reverse=True) and max(sums) - min(sums) <= 1  # 40 = 14+13+13
    assert karmarkar_karp([4], 1) == [[0]]
    with pytest.raises(ValueError, match="parts must be in"):
        karmarkar_karp([1, 2], 3)


def _scripts_step(dynamic: bool, seed: int = 0):
    """The scripts' step: 2,048 rollouts, 256 reference rows, lengths like BIRD's (long
    prompts, the reference responses shorter)."""
    rng = random.Random(seed)
    kinds = ["rollout"] * 2048 + ["reference"] * 256
    lengths = [rng.randint(1500, 4000) for _ in range(2048)]
    lengths += [rng.randint(1200, 3000) for _ in range(256)]
    layout = AuthorsLayout(2048, 256, 2, gpus=8, micro_batch_size=2, dynamic=dynamic)
    return kinds, layout, schedule(kinds, lengths, layout, 32384 if dynamic else None)


def _under_policy(kinds, plan) -> int:
    return sum(
        kinds[r] == "reference"
        for step in plan
        for gpu in step
        for mb in gpu
        if not mb.reference
        for r in mb.rows
    )


def test_the_scripts_step_takes_three_optimiser_steps():
    kinds, layout, plan = _scripts_step(dynamic=False)
    assert len(plan) == 3
    assert [[sum(len(mb.rows) for mb in gpu) for gpu in step] for step in plan] == [
        [128] * 8,
        [128] * 8,
        [32] * 8,
    ]
    # GPU 7's mini-batches: 32 rollouts + 96 reference rows, 128 and 32 reference rows
    last = [plan[k][7] for k in range(3)]
    assert [sum(kinds[r] == "reference" for mb in gpu for r in mb.rows) for gpu in last] == [
        96,
        128,
        32,
    ]
    # pairs never mix the kinds: all 256 reference rows get the divergence, each pair 1/64
    assert _under_policy(kinds, plan) == references_under_policy_loss(layout) == 0
    assert {mb.scale for step in plan for gpu in step for mb in gpu} == {1 / 64}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dynamic_batches_send_the_mixed_mini_batch_through_the_policy_loss(seed):
    kinds, layout, plan = _scripts_step(dynamic=True, seed=seed)
    # every token-balanced micro-batch of the mixed mini-batch holds one of its 32
    # rollouts, so it is typed rollout: the formula's 96
    assert _under_policy(kinds, plan) == references_under_policy_loss(layout) == 96
    scales = [mb.scale * 128 for step in plan for gpu in step for mb in gpu]
    assert scales == [len(mb.rows) for step in plan for gpu in step for mb in gpu]


# ------------------------------------------------------------------ the gradient, step by step


def _trainer(world, out, store, dynamic: bool) -> Trainer:
    overrides = {
        "optim.max_grad_norm": 0.0,
        "optim.weight_decay": 0.0,
        "rollout.max_new_tokens": 8,
        "train.prompts_per_step": 4,
        "train.mini_batch_size": 2,  # 16 rollouts: 4 rows per GPU and mini-batch on 2 GPUs
        "rollout.n": 4,
        "algorithm.dual_clip": DUAL,
        "algorithm.divergence": "js",
        "algorithm.divergence_coef": ETA,
        "reference.store": store,
        "reference.per_step": 4,
        "reference.allow_store_mismatch": True,
        "train.batch_assembly": "authors",
        "algorithm.authors_gpus": 2,
        "algorithm.authors_micro_batch_size": 3,
        "algorithm.authors_dynamic_batch": dynamic,
        "train.micro_batch_tokens": 30 if dynamic else None,
    }
    torch.manual_seed(0)
    cfg = load_config(None, tiny_overrides(world, out, **overrides))
    return Trainer(cfg, reward_fn=sevens_reward)


def _their_loss(model, temp, exp, samples, rollouts, references):
    """One micro-batch of their actor: rows = rollouts then references (index order)."""
    pieces = []  # (per-token loss, mask) per kind
    typed_reference = not rollouts
    for rows, source in ((rollouts, exp), (references, samples)):
        if not rows:
            continue
        data = source.model_inputs(rows)
        lp = token_log_probs(response_logits(model, data), data["responses"], temp)
        mask = data["response_mask"]
        if source is exp:
            old = exp.old_log_probs[rows, : lp.shape[1]]
            adv = exp.advantages[rows].float().unsqueeze(1)
        else:
            old = samples.ref_log_probs[rows, : lp.shape[1]]
            # verl's GRPO: a one-sample group has mean 0, std 1; score 1, eps 1e-6
            adv = torch.full((len(rows), 1), (1.0 - 0.0) / (1.0 + 1e-6))
        if typed_reference:  # js_low_var: u log u - (u + 1) log((u + 1) / 2)
            u = torch.exp(lp - old)
            per_token = ETA * (u * (lp - old) - (u + 1) * torch.log((u + 1) / 2))
        else:  # compute_policy_loss, dual clip c = 3
            ratio = torch.exp(torch.clamp(lp - old, -20.0, 20.0))
            clip1 = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP))
            clip2 = torch.minimum(-adv * DUAL, clip1)
            per_token = torch.where(adv < 0, clip2, clip1)
        pieces.append((per_token, mask))
    # agg_loss token-mean: masked_mean over the whole micro-batch
    return sum((t * m).sum() for t, m in pieces) / (sum(m.sum() for _, m in pieces) + 1e-8)


def _their_step_gradients(
    trainer: Trainer, exp, refs, dynamic: bool
) -> tuple[list[list[torch.Tensor]], int]:
    model, temp = trainer.model, trainer.config.rollout.temperature
    samples = trainer.update.reference_samples
    rows = [("r", i) for i in range(len(exp))] + [("f", j) for j in refs]  # refs appended
    lengths = [
        int((exp if k == "r" else samples).prompt_lengths[i])
        + int((exp if k == "r" else samples).response_lengths[i])
        for k, i in rows
    ]
    gpus, mini, micro, budget = 2, 4, 3, 30
    per_gpu = len(rows) // gpus  # DataProto.chunk
    chunks = [list(range(g * per_gpu, (g + 1) * per_gpu)) for g in range(gpus)]
    steps, under_policy = [], 0
    for k in range(math.ceil(per_gpu / mini)):  # batch.split(ppo_mini_batch_size)
        minis = [c[k * mini : (k + 1) * mini] for c in chunks]
        # rearrange_micro_batches: one count for all ranks (all_reduce MAX)
        count = max(min(len(m), math.ceil(sum(lengths[i] for i in m) / budget)) for m in minis)
        model.zero_grad(set_to_none=True)
        for m in minis:
            if dynamic:
                parts = karmarkar_karp([lengths[i] for i in m], count)
                micro_batches = [[m[i] for i in p] for p in parts]
            else:
                micro_batches = [m[i : i + micro] for i in range(0, len(m), micro)]
            for mb in micro_batches:
                rollouts = [rows[i][1] for i in mb if rows[i][0] == "r"]
                references = [rows[i][1] for i in mb if rows[i][0] == "f"]
                if rows[mb[0]][0] == "f":  # typed by its first sample: all reference
                    assert not rollouts
                else:
                    under_policy += len(references)
                loss = _their_loss(model, temp, exp, samples, rollouts, references)
                scale = len(mb) / mini if dynamic else 1 / (mini // micro)
                (loss * scale / gpus).backward()  # the GPUs' gradients are averaged
        steps.append([p.grad.clone() for p in model.parameters()])
    return steps, under_policy


@pytest.mark.parametrize("dynamic", [False, True])
def test_replica_gradients_equal_the_authors_arithmetic(
    dynamic, tiny_world, reference_store, tmp_path
):
    trainer = _trainer(tiny_world, tmp_path, reference_store, dynamic)
    exp, _, _ = trainer.experience.make(0)
    refs = trainer.ref_sampler.take(4)
    trainer.update.precompute(exp)  # old log-probs, before the policy moves
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off the initial policy: ratios and divergences are not trivial
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    params, got = list(trainer.model.parameters()), []
    trainer.update.optimizer.step = lambda *a, **k: got.append([p.grad.clone() for p in params])
    trainer.model.train()
    meter = MetricMeter()
    assert trainer.update.assembly.run(exp, refs, meter, step=1) == 0
    want, under_policy = _their_step_gradients(trainer, exp, refs, dynamic)
    assert len(got) == len(want) == 3  # 10 rows per GPU: 4 + 4 + 2, a third, small step
    for ours, theirs in zip(got, want, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0.0)
    assert max(float(t.abs().max()) for t in got[2]) > 1e-4  # a real third step
    means = meter.means()
    assert means["dph/optimiser_steps"] == 3.0
    # GPU 1's second mini-batch is 2 rollouts + 2 reference rows: with micro-batches of 3
    # the first holds a reference row; the partitions' mixing depends on the lengths
    assert means["dph/reference_rows_under_policy_loss"] == under_policy
    assert dynamic or under_policy == 1
    # the optimiser is stubbed, so the policy is the same in every step: the logged entropy
    # is the token-mean over all rollouts (each sits in one micro-batch), references left out
    with torch.no_grad():
        data = exp.model_inputs(list(range(len(exp))))
        logits = response_logits(trainer.model, data)
        entropy = entropy_from_logits(logits, temperature=trainer.config.rollout.temperature)
        mask = data["response_mask"].float()
        want_entropy = float((entropy * mask).sum() / mask.sum())
    assert means["actor/entropy"] == pytest.approx(want_entropy, rel=1e-5)


def test_the_replica_trains(tiny_world, reference_store, tmp_path):
    trainer = _trainer(tiny_world, tmp_path, reference_store, dynamic=False)
    history = trainer.train(max_steps=1)
    assert all(math.isfinite(v) for v in history[-1].values())
    assert 0.0 < history[-1]["actor/entropy"] < math.log(trainer.model.config.vocab_size)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "it needs DPH reference samples"),
        (
            {"algorithm.divergence": "js", "algorithm.divergence_coef": 0.1,
             "reference.per_step": 4, "algorithm.divergence_weighting": "paper"},
            "set algorithm.divergence_weighting=authors",
        ),
        (
            {"algorithm.divergence": "js", "algorithm.divergence_coef": 0.1,
             "reference.per_step": 4, "algorithm.authors_dynamic_batch": True},
            "needs train.micro_batch_tokens",
        ),
    ],
)  # fmt: skip
def test_replica_config_errors(extra, message):
    with pytest.raises(ConfigError, match=message):
        load_config(
            None, [f"{k}={v}" for k, v in {"train.batch_assembly": "authors", **extra}.items()]
        )


@pytest.mark.slow
def test_two_processes_run_the_replica_like_one(tiny_world, reference_store, tmp_path):
    extra = {
        "train.total_steps": 2,
        "train.prompts_per_step": 4,
        "train.mini_batch_size": 2,
        "rollout.n": 4,
        "rollout.seeded": True,  # samples independent of the number of processes
        "algorithm.divergence": "js",
        "algorithm.divergence_coef": ETA,
        "reference.store": reference_store,
        "reference.per_step": 4,
        "reference.allow_store_mismatch": True,
        "train.batch_assembly": "authors",
        "algorithm.authors_gpus": 2,
        "algorithm.authors_micro_batch_size": 3,
        # Adam moves a weight by lr * m / (sqrt(v) + eps): with eps 1e-8 a float-rounding
        # difference in a gradient entry near 1e-8 (2 processes sum in another order) moves
        # that weight by up to ~lr, on some CPUs and not others; with eps 1e-3 such an
        # entry moves by ~1e-6 lr, and the comparison below holds on any CPU
        "optim.eps": 1e-3,
    }
    dist_dir = tmp_path / "dist"
    dist_dir.mkdir()
    worker = Path(__file__).parent / "dist_worker.py"
    overrides = tiny_overrides(tiny_world, dist_dir / "run", **extra)
    proc = run_torchrun(worker, str(dist_dir), *overrides, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    single = Trainer(
        load_config(None, tiny_overrides(tiny_world, tmp_path / "single", **extra)),
        reward_fn=sevens_reward,
    )
    expected = single.train()
    got = json.loads((dist_dir / "history.json").read_text())
    for a, b in zip(got, expected, strict=True):
        assert a["reward/score"] == b["reward/score"]
        assert a["dph/optimiser_steps"] == b["dph/optimiser_steps"] == 3.0
        for key in ("loss/total", "actor/grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    rank0 = torch.load(dist_dir / "rank0.pt")
    ref = single.accelerator.unwrap_model(single.model).state_dict()
    for k, v in ref.items():
        torch.testing.assert_close(rank0[k], v, rtol=1e-4, atol=1e-5)
