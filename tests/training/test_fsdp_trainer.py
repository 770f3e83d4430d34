"""``train.strategy=fsdp`` through the trainer: 2 CPU processes (torchrun, gloo) train like
one process, resume exactly, resume on 1 process, feed vLLM the full weights, and export.

One ``torchrun`` run of tests/training/fsdp_train_worker.py trains every case; the tests
compare what it wrote with single-process runs of the same configs.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from train_helpers import run_torchrun, sevens_reward, tiny_overrides

from divrl.training.config import load_config
from divrl.training.trainer import TIME_KEYS, Trainer

WORKER = Path(__file__).parent / "fsdp_train_worker.py"

COMMON = {
    "train.strategy": "fsdp",
    "train.total_steps": 3,
    "train.micro_batch_size": 4,
    "train.mini_batch_size": 2,  # off-policy: the old-log-prob pass runs sharded too
    "train.length_bucketing": False,  # micro-batches = each rank's rows (Lp-Reg selects per one)
    "rollout.seeded": True,  # samples independent of the number of processes
}
LP_REG = {"algorithm.policy_loss": "lp_reg", "algorithm.loss_options.rho": 0.5}


def _cases(world: dict, store: Path, root: Path) -> dict[str, dict]:
    dph = {
        "algorithm.divergence": "js",
        "algorithm.divergence_coef": 0.2,
        # token-means of each stream: independent of how the samples are cut into
        # micro-batches ('authors', the mean over micro-batches, is not: 2 processes make
        # more, smaller reference micro-batches than 1)
        "algorithm.divergence_weighting": "paper",
        "reference.store": store,
        "reference.k": 4,  # as the fixture store was presampled
        "reference.per_step": 4,
    }
    resume = {
        **LP_REG,
        **dph,
        "train.total_steps": 6,
        "optim.schedule": "cosine",
        "optim.warmup_steps": 2,
        "checkpoint.save_every": 2,
        "checkpoint.keep_last": 1,
    }
    return {
        "grpo": {**COMMON, "checkpoint.save_final": True},
        "lp_reg": {**COMMON, **LP_REG},
        "dph_js": {**COMMON, **dph},
        # CPUOffloadPolicy (shards, gradients and AdamW state in host memory) and no
        # resharding after forward: the same numbers
        "offload": {
            **COMMON,
            "train.fsdp_offload": True,
            "train.fsdp_reshard_after_forward": False,
        },
        # a sharded frozen reference model (no optimiser), gradient checkpointing under FSDP
        "reverse_kl": {
            **COMMON,
            "algorithm.kl_coef": 0.05,
            "model.gradient_checkpointing": True,
        },
        "full": {**COMMON, **resume},
        "killed": {**COMMON, **resume},
    }


@pytest.fixture(scope="module")
def fsdp_runs(tiny_world, reference_store, tmp_path_factory):
    """(root of the worker's outputs, overrides of each case)."""
    root = tmp_path_factory.mktemp("fsdp_trainer")
    cases = _cases(tiny_world, reference_store, root)
    overrides = {
        name: tiny_overrides(tiny_world, root / name / "run", **extra)
        for name, extra in cases.items()
    }
    spec = [{"name": name, "overrides": overrides[name]} for name in cases]
    spec[0]["vllm"] = True
    # the session's reference store, presampled again by 2 fsdp processes
    # with the session store's engine (hf): engines draw different samples from one seed
    store_args = {
        "reference.store": root / "presample_store",
        "reference.k": 4,
        "rollout.engine": "hf",
    }
    store_args["train.strategy"] = "fsdp"
    presample_args = tiny_overrides(tiny_world, root / "presample", **store_args)
    spec.insert(0, {"name": "presample", "presample": True, "overrides": presample_args})
    spec[-1]["kill_at"] = 5  # after the step-4 checkpoint and one more logged step
    (root / "cases.json").write_text(json.dumps(spec))
    proc = run_torchrun(WORKER, str(root), timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return root, overrides


def test_presample_under_fsdp_writes_the_single_process_store(fsdp_runs, reference_store):
    from divrl.data.reference_store import ReferenceStore

    root, _ = fsdp_runs
    two, one = ReferenceStore.open(root / "presample_store"), ReferenceStore.open(reference_store)
    assert len(one) > 0 and len(two) == len(one)
    assert two.exploration_ids == one.exploration_ids
    for a, b in zip(two.samples, one.samples, strict=True):
        assert (a.prompt_id, a.response_ids) == (b.prompt_id, b.response_ids)
        torch.testing.assert_close(
            torch.tensor(a.ref_log_probs), torch.tensor(b.ref_log_probs), rtol=0, atol=1e-5
        )


def _single(overrides: list[str], out: Path, **changes) -> Trainer:
    """The same config on one process (its own output directory)."""
    args = [a for a in overrides if not a.startswith("logging.output_dir=")]
    args += [f"logging.output_dir={out}"] + [f"{k}={v}" for k, v in changes.items()]
    return Trainer(load_config(None, args), reward_fn=sevens_reward)


def _params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in trainer.policy.named_parameters()}


@pytest.mark.parametrize("case", ["grpo", "lp_reg", "dph_js", "offload", "reverse_kl"])
def test_two_fsdp_processes_match_one(fsdp_runs, case, tmp_path):
    root, overrides = fsdp_runs
    single = _single(overrides[case], tmp_path / "single")
    expected = single.train()
    got = json.loads((root / case / "history.json").read_text())
    assert len(got) == len(expected) == 3
    for a, b in zip(got, expected, strict=True):
        assert a["reward/score"] == b["reward/score"]  # the same (seeded) samples
        for key in ("loss/total", "actor/grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
        assert set(a) - set(TIME_KEYS) == set(b) - set(TIME_KEYS)
    sharded = torch.load(root / case / "params.pt")
    reference = _params(single)
    assert sharded.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(sharded[name], value, rtol=0, atol=1e-5)
    if case == "reverse_kl":
        assert got[-1]["actor/ref_kl"] > 0
    if case == "lp_reg":  # the proxy comes from the same forwards: none extra, sharded too
        assert any(k.startswith("lp_reg/") for k in got[-1])
        grpo_forwards = json.loads((root / "grpo" / "forwards.json").read_text())
        assert json.loads((root / "lp_reg" / "forwards.json").read_text()) == grpo_forwards


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]


def test_fsdp_kill_and_resume_is_exact(fsdp_runs):
    root, _ = fsdp_runs
    assert json.loads((root / "killed" / "resumed_step.json").read_text()) == 4
    full, killed = root / "full" / "run", root / "killed" / "run"
    assert len(_metrics(full)) == 6
    assert _metrics(killed) == _metrics(full)
    a = torch.load(root / "full" / "params.pt")
    b = torch.load(root / "killed" / "params.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    step4 = root / "killed_copy" / "run" / "checkpoints" / "step_000004"
    assert sorted(p.name for p in step4.iterdir()) == [
        "model",
        "rng_state_0.pth",
        "rng_state_1.pth",
        "scheduler.pt",
        "state",
        "trainer_state.json",
    ]


def test_fsdp_checkpoint_resumes_on_one_process(fsdp_runs, tmp_path):
    """Saved by 2 processes at step 4, resumed by one: it ends where the 2-process run does.
    It resumes a copy of the saved run, whose step-4 checkpoint other tests read."""
    root, overrides = fsdp_runs
    run = tmp_path / "run"
    shutil.copytree(root / "killed_copy" / "run", run)
    args = [a for a in overrides["killed"] if not a.startswith("logging.output_dir=")]
    args.append(f"logging.output_dir={run}")
    resumed = Trainer(load_config(None, args), reward_fn=sevens_reward, resume=True)
    assert resumed.step == 4 and resumed.world == 1
    resumed.train()
    expected = torch.load(root / "full" / "params.pt")
    for name, value in _params(resumed).items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-5)
    got = _metrics(run)
    want = _metrics(root / "full" / "run")
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(got[4:], want[4:], strict=True):
        assert a["reward/score"] == b["reward/score"]
        assert a["loss/total"] == pytest.approx(b["loss/total"], rel=1e-4, abs=1e-6)


def test_vllm_stand_in_receives_the_full_weights(fsdp_runs):
    root, _ = fsdp_runs
    received = torch.load(root / "grpo" / "vllm_received.pt")
    trained = torch.load(root / "grpo" / "params.pt")
    assert received.keys() == trained.keys()  # Hugging Face names, every parameter
    assert all(torch.equal(received[k], trained[k]) for k in trained)


def test_trl_lp_reg_head_check_refuses_an_fsdp2_shard(fsdp_runs):
    root, _ = fsdp_runs
    for rank in (0, 1):
        assert json.loads((root / "grpo" / f"lm_head_refused_rank{rank}.json").read_text())


def test_export_and_eval_of_an_fsdp_run(fsdp_runs, tmp_path):
    from fsdp_train_worker import GREEDY_PROMPT
    from transformers import AutoModelForCausalLM

    from divrl.checkpoint.dcp import export_hf
    from divrl.evaluation.runner import resolve_model_path

    root, _ = fsdp_runs
    run = root / "grpo" / "run"
    exported = AutoModelForCausalLM.from_pretrained(export_hf(run, tmp_path / "hf"))
    trained = torch.load(root / "grpo" / "params.pt")
    state = exported.state_dict()
    assert all(torch.equal(state[k], v) for k, v in trained.items())
    out = exported.generate(
        torch.tensor([GREEDY_PROMPT]), do_sample=False, max_new_tokens=8, pad_token_id=0
    )
    tokens = out[0, len(GREEDY_PROMPT) :].tolist()
    for rank in (0, 1):
        sharded = json.loads((root / "grpo" / f"greedy_rank{rank}.json").read_text())
        assert sharded  # an empty record would make the prefix check below vacuous
        assert tokens[: len(sharded)] == sharded
    # divrl eval: a run directory trained under fsdp resolves to a complete model folder
    model_dir = resolve_model_path(run)
    evaluated = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert all(torch.equal(evaluated[k], v) for k, v in trained.items())


def test_fsdp_needs_reference_samples_divisible_by_processes_and_mini_batches(tiny_world):
    from divrl.training.config import check_divisibility

    def config(strategy: str, per_step: int):
        extra = {
            "train.strategy": strategy,
            "train.mini_batch_size": 2,
            "reference.per_step": per_step,
        }
        return load_config(None, tiny_overrides(tiny_world, "unused", **extra))

    check_divisibility(config("ddp", 2), world=2)  # ddp: uneven shares are fine
    check_divisibility(config("fsdp", 4), world=2)
    with pytest.raises(ValueError, match="processes x mini-batches"):
        check_divisibility(config("fsdp", 2), world=2)
    budget = config("fsdp", 4)
    budget.train.micro_batch_tokens = 64
    check_divisibility(budget, world=1)
    with pytest.raises(ValueError, match="micro_batch_tokens=null"):
        check_divisibility(budget, world=2)


def test_diversity_curves_read_an_fsdp_run(fsdp_runs):
    from transformers import AutoModelForCausalLM

    from divrl.evaluation.diversity import checkpoint_models

    root, _ = fsdp_runs
    models = checkpoint_models(root / "full" / "run")  # keep_last=1: the step-6 checkpoint
    assert [step for step, _ in models] == [6]
    state = AutoModelForCausalLM.from_pretrained(models[0][1]).state_dict()
    trained = torch.load(root / "full" / "params.pt")
    assert all(torch.equal(state[k], v) for k, v in trained.items())
