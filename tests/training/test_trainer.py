import dataclasses
import json
import math

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from train_helpers import parity_reward, sevens_reward, tiny_overrides

from divrl.data.reference_store import ReferenceStore
from divrl.training import loading as loading_mod
from divrl.training import update as update_mod
from divrl.training.config import load_config
from divrl.training.presample import presample
from divrl.training.trainer import Trainer, overlong_penalty


def _trainer(world, out_dir, reward=sevens_reward, config=None, resume=False, **overrides):
    cfg = load_config(config, tiny_overrides(world, out_dir, **overrides))
    return Trainer(cfg, reward_fn=reward, resume=resume)


def _params(trainer):
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_overlong_penalty():
    assert overlong_penalty(10, 20, 0, 1.0) == 0.0
    assert overlong_penalty(15, 20, 5, 1.0) == 0.0
    assert overlong_penalty(16, 20, 5, 1.0) == pytest.approx(-0.2)
    assert overlong_penalty(20, 20, 5, 0.5) == pytest.approx(-0.5)


def test_grpo_raises_a_learnable_reward(tiny_world, tmp_path):
    tr = _trainer(tiny_world, tmp_path, **{"train.total_steps": 15, "optim.lr": 0.02})
    history = tr.train()
    rewards = [h["reward/score"] for h in history]
    assert all(math.isfinite(h["loss/total"]) for h in history)
    first, last = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    assert last > first + 0.3, rewards
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, 16))
    for key in ("reward/pass@1", "actor/entropy", "pg/approx_kl", "time/step", "actor/lr"):
        assert key in lines[-1]
    # the hf engine's sampling log-probs agree with the trainer's forward pass
    assert all(0 <= h["rollout/log_prob_diff"] < 1e-4 for h in history)


def test_nan_loss_step_is_skipped_and_training_continues(tiny_world, tmp_path):
    tr = _trainer(tiny_world, tmp_path, **{"train.total_steps": 3})
    spec = tr.update.loss_spec
    real = spec.fn

    def poisoned(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        if tr.step == 1:  # the second step (0-based counter before the increment)
            loss = loss * float("nan")
        return loss, metrics

    tr.update.loss_spec = dataclasses.replace(spec, fn=poisoned)
    before = {}

    def snapshot(step, record):
        before[step] = _params(tr)

    history = tr.train(on_step=snapshot)
    assert [h["actor/skipped_steps"] for h in history] == [0.0, 1.0, 0.0]
    for k, v in before[1].items():  # step 2 changed nothing
        assert torch.equal(v, before[2][k]), k
    assert any(not torch.equal(v, before[3][k]) for k, v in before[2].items())
    assert all(torch.isfinite(v).all() for v in before[3].values())


def test_dynamic_sampling_drops_constant_groups_and_refills(tiny_world, tmp_path):
    tr = _trainer(
        tiny_world,
        tmp_path,
        reward=parity_reward,
        **{
            "algorithm.dynamic_sampling": True,
            "algorithm.max_refill_rounds": 0,
            "train.total_steps": 1,
        },
    )
    (h,) = tr.train()
    # parity reward: every group is constant, so every group is dropped and nothing trains
    assert h["dapo/dropped_groups"] == 4 and h["dapo/kept_groups"] == 0
    tr = _trainer(
        tiny_world,
        tmp_path / "b",
        **{
            "algorithm.dynamic_sampling": True,
            "algorithm.max_refill_rounds": 8,
            "train.total_steps": 2,
        },
    )
    history = tr.train()
    for h in history:
        assert h["dapo/kept_groups"] == 4  # refilled to prompts_per_step
        assert h["dapo/rounds"] >= 1


def test_reverse_kl_loads_a_frozen_reference_and_logs_kl(tiny_world, tmp_path):
    tr = _trainer(tiny_world, tmp_path, **{"algorithm.kl_coef": 0.1, "train.total_steps": 2})
    assert tr.ref_model is not None
    assert not any(p.requires_grad for p in tr.ref_model.parameters())
    history = tr.train()
    assert history[0]["actor/ref_kl"] == pytest.approx(0.0, abs=1e-6)  # same weights at step 1
    assert history[1]["actor/ref_kl"] > 0


def test_presample_split_and_dph_training_without_a_reference_model(
    tiny_world, tmp_path, monkeypatch
):
    store = tmp_path / "store"
    overrides = tiny_overrides(
        tiny_world,
        tmp_path,
        **{
            "reference.store": store,
            "reference.k": 4,
            "reference.per_step": 4,
            "algorithm.divergence": "forward_kl",
            "algorithm.divergence_coef": 0.5,
        },
    )
    cfg = load_config(None, overrides)
    manifest = presample(cfg, reward_fn=parity_reward, progress=False)
    stats = manifest["stats"]
    assert (stats["prompts"], stats["near_perfect"], stats["reference_samples"]) == (16, 8, 8)
    assert manifest["sampling"]["top_p"] == 0.95 and manifest["threshold"] == 4
    ref = ReferenceStore(store)
    assert len(ref) == 8
    assert ref.exploration_ids == {f"p{i}" for i in range(1, 16, 2)}

    loads = []
    real = loading_mod.load_policy
    monkeypatch.setattr(
        loading_mod, "load_policy", lambda *a, **k: loads.append(1) or real(*a, **k)
    )
    tr = Trainer(cfg, reward_fn=sevens_reward)  # a reward that moves the policy
    assert len(loads) == 1 and tr.ref_model is None  # the policy only: no reference model
    assert {p.id for p in tr.prompts} == ref.exploration_ids
    history = tr.train()
    # stored log-probs are the initial policy's: u = 1 and the forward KL is 0 at step 1
    assert history[0]["dph/u_mean"] == pytest.approx(1.0, abs=1e-5)
    assert history[0]["dph/divergence"] == pytest.approx(0.0, abs=1e-6)
    assert history[-1]["dph/divergence"] > 0


def test_presample_keeps_the_correct_presampled_responses_when_asked(tiny_world, tmp_path):
    """reference.keep_presampled: the store holds the near-perfect prompts' correct
    presampled responses as well as the correct extra ones, and nothing else."""

    def even_prompt_and_even_length(requests):  # differs between a prompt's responses
        return [
            float(((int(r.ground_truth) - 1) // 2) % 2 == 0 and len(r.solution_str) % 2 == 0)
            for r in requests
        ]

    calls = []

    def reward(requests):
        scores = even_prompt_and_even_length(requests)
        calls.append(list(zip(requests, scores, strict=True)))
        return scores

    overrides = tiny_overrides(
        tiny_world,
        tmp_path,
        **{
            "reference.store": tmp_path / "store",
            "reference.k": 4,
            "reference.threshold": 1,
            "reference.keep_presampled": True,
        },
    )
    stats = presample(load_config(None, overrides), reward_fn=reward, progress=False)["stats"]
    presampled, extra = calls  # the k per prompt, then one more per near-perfect prompt
    correct = {}
    for r, score in presampled:
        correct.setdefault(r.ground_truth, []).append(score == 1.0)
    near = {gt for gt, c in correct.items() if sum(c) >= 1}
    expected_presampled = sum(sum(correct[gt]) for gt in near)
    expected_extra = sum(score == 1.0 for _, score in extra)
    assert 0 < expected_presampled < 4 * len(near)  # the reward splits prompts' responses
    assert stats["presampled_kept"] == expected_presampled
    assert stats["reference_samples"] == expected_presampled + expected_extra
    store = ReferenceStore(tmp_path / "store")
    assert len(store) == stats["reference_samples"]
    assert store.manifest["keep_presampled"] is True
    for s in store.samples:  # every kept response is correct, of an even (near) prompt
        assert len(s.text) % 2 == 0 and int(s.prompt_id[1:]) % 2 == 0
        assert len(s.ref_log_probs) == len(s.response_ids)


def test_lp_reg_proxy_needs_no_extra_forward(tiny_world, tmp_path, monkeypatch):
    calls = []
    real = update_mod.response_logits
    monkeypatch.setattr(
        update_mod, "response_logits", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    counts = {}
    for name, extra in [
        ("vanilla_on", {}),
        ("lp_reg_on", {"algorithm.policy_loss": "lp_reg", "algorithm.loss_options.rho": 0.5}),
        ("vanilla_off", {"train.mini_batch_size": 2}),
        (
            "lp_reg_off",
            {
                "algorithm.policy_loss": "lp_reg",
                "algorithm.loss_options.rho": 0.5,
                "train.mini_batch_size": 2,
            },
        ),
    ]:
        tr = _trainer(tiny_world, tmp_path / name, **{"train.total_steps": 2, **extra})
        calls.clear()
        history = tr.train()
        counts[name] = len(calls)
        if name.startswith("lp_reg"):
            assert any(k.startswith("lp_reg/") for k in history[-1]), sorted(history[-1])
    assert counts["lp_reg_on"] == counts["vanilla_on"]
    assert counts["lp_reg_off"] == counts["vanilla_off"]


def test_logits_chunking_does_not_change_the_run(tiny_world, tmp_path):
    extra = {
        "train.total_steps": 2,
        "algorithm.policy_loss": "lp_reg",
        "algorithm.loss_options.rho": 0.5,
        "algorithm.entropy_coef": 0.01,
    }
    plain = _trainer(tiny_world, tmp_path / "a", **extra).train()
    chunked = _trainer(
        tiny_world, tmp_path / "b", **extra, **{"train.logits_chunk_size": 3}
    ).train()
    for a, b in zip(plain, chunked, strict=True):
        for key in ("loss/total", "actor/entropy", "lp_reg/num_regularized", "reward/score"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key


def test_length_bucketing_cuts_padding_and_keeps_the_update(tiny_world, tmp_path):
    extra = {"train.total_steps": 1, "train.micro_batch_size": 4, "rollout.max_new_tokens": 12}
    runs = {}
    for on in (False, True):
        tr = _trainer(tiny_world, tmp_path / str(on), **extra, **{"train.length_bucketing": on})
        grads = []

        def keep_grads(optimizer, args, kwargs, grads=grads):
            grads.extend(
                p.grad.detach().clone() for g in optimizer.param_groups for p in g["params"]
            )

        handle = register_optimizer_step_pre_hook(keep_grads)
        try:
            (metrics,) = tr.train()
        finally:
            handle.remove()
        runs[on] = (metrics, grads, _params(tr))
    (plain, g_plain, _), (bucketed, g_bucketed, p_bucketed) = runs[False], runs[True]
    assert bucketed["perf/padding_frac"] < plain["perf/padding_frac"]
    # token-mean: the same tokens with the same weights, only grouped differently
    assert bucketed["loss/total"] == pytest.approx(plain["loss/total"], rel=1e-5, abs=1e-7)
    # The claim is about the gradient, compared before Adam: Adam's first step is
    # lr * g / (|g| + eps), which turns a float-rounding difference in a gradient entry near
    # eps into a visible weight difference on some CPUs and not others. Grouping the same
    # token terms differently reorders fp32 sums: entries agree to a relative 1e-4, and an
    # entry that cancels to ~0 agrees to 1e-5 of its tensor's largest entry.
    assert len(g_plain) == len(g_bucketed) > 0
    for a, b in zip(g_bucketed, g_plain, strict=True):
        scale = float(b.abs().max())
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * scale + 1e-12)
    initial = _params(_trainer(tiny_world, tmp_path / "initial"))
    assert any(not torch.equal(v, initial[k]) for k, v in p_bucketed.items())


def test_batch_log_probs_keeps_the_input_order_when_bucketing(tiny_world):
    from transformers import AutoModelForCausalLM

    from divrl.training.forward import batch_log_probs

    model = AutoModelForCausalLM.from_pretrained(tiny_world["model"]).eval()
    prompts = [[3, 4, 5], [3], [4, 5, 6, 7, 8], [5, 6]]
    responses = [[6, 7], [8, 9, 10, 11, 12], [13], [14, 15, 16]]
    kwargs = dict(pad_token_id=0, temperature=1.0, micro_batch_size=2)
    sorted_lp = batch_log_probs(model, prompts, responses, length_bucketing=True, **kwargs)
    plain_lp = batch_log_probs(model, prompts, responses, length_bucketing=False, **kwargs)
    single = [
        batch_log_probs(model, [p], [r], **kwargs)[0]
        for p, r in zip(prompts, responses, strict=True)
    ]
    for a, b, c, r in zip(sorted_lp, plain_lp, single, responses, strict=True):
        assert len(a) == len(r)
        assert a == pytest.approx(c, abs=1e-5)
        assert b == pytest.approx(c, abs=1e-5)
