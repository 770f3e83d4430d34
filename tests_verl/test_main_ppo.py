"""End to end on a CPU: verl's own trainer (``python -m verl.trainer.main_ppo``: Ray, FSDP2
engine workers, TransferQueue, the v1 synchronous trainer) runs through divrl's trainer
mode ``divrl_sync`` on a tiny model built here: 2 steps of DPH-JS and of Lp-Reg, and the
identity check against verl's own ``sync`` trainer.

The CPU pieces verl lacks are test-only (:mod:`tests_verl.cpu_verl`); each run is a
subprocess under a hard ``timeout`` (about a minute each on a 2-core machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from divrl.integrations.verl.data import write_exploration_split
from tests_verl import e2e
from tests_verl.checkpoint_eval import assert_divrl_reads_verls_checkpoint

#: each run's hard limit (seconds); a machine much slower than CI's sets it higher
TIMEOUT_S = int(os.environ.get("DIVRL_VERL_E2E_TIMEOUT", "480"))
#: a reward that varies between a prompt's samples (``tests_verl/e2e_reward.py``)
VARIED_REWARD = Path(__file__).with_name("e2e_reward.py")

pytestmark = pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("main_ppo")
    model = e2e.build_model(root / "model")
    data = e2e.write_data(root / "train.parquet")
    return root, model, data


def _run(root, model, data, *extra, mode="divrl_sync", out=None, reward=None, env=None):
    """One verl run; its console output and the per-step metrics verl's file logger wrote."""
    out = out or root / "checkpoints"
    metrics = Path(f"{out}.metrics.jsonl")
    metrics.unlink(missing_ok=True)
    cmd = e2e.command(model, data, out, f"trainer.v1.trainer_mode={mode}", *extra, reward=reward)
    proc = subprocess.run(
        ["timeout", "-k", "10", str(TIMEOUT_S), *cmd],
        env={**e2e.env(metrics), **(env or {})},
        cwd=root,
        capture_output=True,
        text=True,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    return log, e2e.step_metrics(metrics)


#: fp32 parameters and fp32 compute (verl's FSDP engine computes in bf16 unless its
#: mixed-precision policy says otherwise), and SGD: for runs compared to rounding size
FP32_COMPUTE = (
    "actor_rollout_ref.actor.fsdp_config.dtype=float32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision="
    "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
    "actor_rollout_ref.actor.optim.optimizer=SGD",
)

#: the per-step metrics the identity run compares (loss, gradient norm, entropy, reward)
IDENTITY_METRICS = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean")


def _dumps(folder: Path) -> list[dict]:
    """The loss calls :mod:`tests_verl.loss_dump` saved from the workers."""
    import torch

    return [torch.load(f, weights_only=False) for f in sorted(folder.glob("*.pt"))]


@pytest.fixture(scope="module")
def vanilla_sync(world):
    """verl's own sync run, fp32, the varied reward: (per-step metrics, checkpoint files)."""
    root, model, data = world
    out_dir = root / "identity_sync"
    _, steps = _run(
        root,
        model,
        data,
        *FP32_COMPUTE,
        "trainer.save_freq=2",
        mode="sync",
        out=out_dir,
        reward=VARIED_REWARD,
    )
    return steps, e2e.checkpoint_files(out_dir / "global_step_2")


#: Lp-Reg options under which the regulariser acts on the random tiny model: its next-token
#: distributions are nearly flat (no probability below 0.5 x the largest one), so the
#: default min-p ratio 0.02 filters nothing and the proxy equals the policy (nothing is
#: below it); at 0.7 about a quarter of each row is filtered, and every negative-advantage
#: token is selected
LP_REG_ACTS = (
    "+divrl.loss_options.rho=1.0",
    "+divrl.loss_options.min_k=1",
    "+divrl.loss_options.kappa=0.7",
)


def test_lp_reg_in_verls_trainer_is_lp_reg_loss_on_the_same_tensors(world, vanilla_sync):
    """Lp-Reg inside main_ppo (fp32 compute): every update micro-batch's loss equals
    divrl's standalone lp_reg_loss on the tensors of that call (log-probs of verl's forward,
    pi_old's proxy from the old-log-prob pass), times its share of verl's token count; the
    regulariser acts on some tokens, and the step's gradient differs from verl's vanilla
    run's (same seed, same rollouts at step 1)."""
    import torch

    from divrl.algorithms import lp_reg_loss
    from divrl.integrations.verl import keys

    root, model, data = world
    dump = root / "lp_reg_dump"
    _, steps = _run(
        root,
        model,
        data,
        *FP32_COMPUTE,
        "+divrl.policy_loss=lp_reg",
        *LP_REG_ACTS,
        "actor_rollout_ref.actor.clip_ratio_low=1.0",
        "actor_rollout_ref.actor.clip_ratio_high=9.0",
        reward=VARIED_REWARD,
        env={"DIVRL_VERL_DUMP": str(dump)},
    )
    assert [s["step"] for s in steps] == [1.0, 2.0]
    records, regularized = _dumps(dump), 0.0
    assert len(records) >= 2  # one micro-batch of 4 rows a step
    for r in records:
        mask = r["response_mask"].to(r["log_prob"].dtype)
        want, metrics = lp_reg_loss(
            r["log_prob"],
            r["old_log_probs"],
            r[keys.PROXY_LOG_PROB],
            r["advantages"],
            mask,
            rho=1.0,
            min_k=1,
            clip_low=1.0,
            clip_high=9.0,
        )
        share = float(mask.sum()) / float(r["batch_num_tokens"]) * int(r["dp_size"])
        torch.testing.assert_close(r["loss"], want * share, rtol=1e-6, atol=0)
        assert r["metrics"]["lp_reg/num_regularized"] == metrics["lp_reg/num_regularized"]
        regularized += metrics["lp_reg/num_regularized"]
    assert regularized > 0
    vanilla, _ = vanilla_sync
    assert steps[0]["critic/score/mean"] == pytest.approx(vanilla[0]["critic/score/mean"])
    assert steps[0]["actor/grad_norm"] != pytest.approx(vanilla[0]["actor/grad_norm"], rel=1e-3)


def test_dph_js_in_verls_trainer_is_reference_divergence_loss_on_the_same_tensors(world):
    """DPH-JS inside main_ppo (fp32 compute), 2 rehearsal rows a step: the DPH term the
    plugin computed on each micro-batch's rehearsal rows equals divrl's standalone
    reference_divergence_loss on that call's tensors; u = pi / pi_ref is 1 at step 1 (the
    store holds the tiny model's own log-probs)."""
    import torch

    from divrl.algorithms import reference_divergence_loss
    from divrl.integrations.verl import keys

    root, model, data = world
    store = e2e.write_store(root / "store", model, data)
    exploration = root / "exploration.parquet"
    assert write_exploration_split(data, store, exploration) == 2
    dump = root / "dph_dump"
    _, steps = _run(
        root,
        model,
        exploration,
        *FP32_COMPUTE,
        "+divrl.divergence=js",
        "+divrl.divergence_coef=0.2",
        "+divrl.divergence_weighting=paper",
        f"+divrl.reference_store={store}",
        "+divrl.reference_per_step=2",
        env={"DIVRL_VERL_DUMP": str(dump)},
    )
    assert [s["step"] for s in steps] == [1.0, 2.0]
    checked = 0
    for r in _dumps(dump):
        rows = r[keys.IS_REFERENCE].bool()
        if not bool((r["response_mask"][rows] > 0).any()):
            continue
        mask = r["response_mask"].to(r["log_prob"].dtype)
        want, _ = reference_divergence_loss(
            r["log_prob"][rows], r[keys.REF_LOG_PROB][rows], mask[rows], "js", None
        )
        torch.testing.assert_close(r["reference_term"], want, rtol=1e-6, atol=0)
        checked += 1
    assert checked >= 2  # each step's rehearsal rows reached the loss
    assert abs(steps[0]["actor/dph/u_mean"] - 1.0) < 1e-3


def test_divrl_sync_with_dph_and_lp_reg_off_is_verls_sync_run(world, vanilla_sync):
    """divrl's trainer mode with eta = 0 and Lp-Reg off against verl's own sync trainer:
    same seed, 2 steps, fp32; the same per-step metrics to 1e-6 (relative) and the same
    checkpoint files (gen_batch_size and the replay buffer: test_sync_mode.py).

    "fp32" means fp32 compute too: verl's FSDP engine computes in bf16 by default (its
    mixed-precision policy) even with fp32 parameters, and verl's batch holds the rows in the
    order their rollouts finished, which differs between runs, so which rows share a
    micro-batch (and its padding) differs too; in bf16 that moved step 1's gradient norm by
    7e-5 (relative) in two CI runs, in fp32 only by rounding. SGD
    rather than AdamW, whose first step divides each component by its own size, so step 2
    does not enlarge the rounding-size differences that remain."""
    root, model, data = world
    out_dir = root / "identity_divrl_sync"
    _, ours = _run(
        root,
        model,
        data,
        *FP32_COMPUTE,
        "trainer.save_freq=2",
        "+divrl.divergence=js",
        "+divrl.divergence_coef=0",
        out=out_dir,
        reward=VARIED_REWARD,
    )
    our_files = e2e.checkpoint_files(out_dir / "global_step_2")
    verl_steps, verl_files = vanilla_sync
    assert [s["step"] for s in verl_steps] == [s["step"] for s in ours] == [1.0, 2.0]
    for theirs, mine in zip(verl_steps, ours, strict=True):
        for name in IDENTITY_METRICS:
            # abs: a step whose advantages cancel has a loss of 0 up to the float32 rounding
            # of its token mean, which the rows' order moves (1.5e-8 against 0.0 in one run)
            assert mine[name] == pytest.approx(theirs[name], rel=1e-6, abs=1e-7), name
    assert our_files == verl_files and "data.pt" in verl_files
    # divrl eval's model for verl's checkpoint folder: its last step, as verl's merger has it
    assert_divrl_reads_verls_checkpoint(root / "identity_sync", 2, root)
    # the comparison has something to compare: the advantages were not all zero
    assert any(s["actor/grad_norm"] > 0 for s in verl_steps)
    assert any(s["actor/pg_loss"] != 0 for s in verl_steps)


#: two ranks, verl's dynamic batch sizes, DPH-JS with the rehearsal controller and Lp-Reg
TWO_RANKS = (
    "trainer.n_gpus_per_node=2",
    "ray_kwargs.ray_init.num_gpus=2",
    "actor_rollout_ref.rollout.n=4",  # 4 samples a group: rewards that differ within one
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=256",
    "actor_rollout_ref.actor.fsdp_config.dtype=float32",
    "trainer.save_freq=2",
    "+divrl.divergence=js",
    "+divrl.divergence_coef=0.2",
    "+divrl.divergence_weighting=paper",
    "+divrl.reference_per_step=3",
    "+divrl.rehearsal_control.target=0.001",
    "+divrl.rehearsal_control.warmup_steps=1",
    "+divrl.policy_loss=lp_reg",
    "+divrl.loss_options.rho=0.5",
    "+divrl.loss_options.min_k=1",
    "actor_rollout_ref.actor.clip_ratio_low=1.0",
    "actor_rollout_ref.actor.clip_ratio_high=9.0",
)


#: what a step's rollout gives (its prompts, samples and rewards): the same in every run,
#: and after a resume the unbroken run's
ROLLOUT_METRICS = ("critic/", "response_length/", "prompt_length/")
#: what a step's update gives whichever rows share a micro-batch. verl's batch holds the rows
#: in the order their rollouts finished, which differs between runs, so verl's dynamic
#: micro-batches and its split over the ranks group other rows together in each run; the
#: loss, its gradient and the DPH metrics are sums over the mini-batch's tokens, which the
#: grouping moves by float32 rounding only (fp32 compute); the controller's state and the
#: draw position not at all. Not compared: Lp-Reg's statistics (``actor/lp_reg/*``), which
#: are taken per micro-batch, as its selection is (docs/verl.md, "Resume")
ORDER_FREE = (
    "actor/loss",
    "actor/pg_loss",
    "actor/pg/",
    "actor/dph/u",
    "actor/dph/log_u",
    "actor/dph/divergence",
    "actor/grad_norm",
    "actor/entropy",
    "divrl/rehearsal",
    "divrl/dph/control",
)
#: the controller's eta: it moves log eta by rate x (m - target) / target a step, so the
#: rounding of its measurement m (``log_u_mean``, up to the 2e-7 the test allows) moves eta
#: by up to 0.1 x 2e-7 / 0.001 = 2e-5 (relative) a step; 4.0e-6 measured between two runs
CONTROLLER = ("divrl/dph/eta", "actor/dph/effective_eta")
CONTROLLER_REL = 2 * 0.1 * 2e-7 / 0.001  # two steps of the test's rate and target


def _differing(mine: dict, theirs: dict, prefixes: tuple, rel: float, near_0: float) -> dict:
    """The metrics under ``prefixes`` of one step that differ by more than ``rel``, or by
    more than ``near_0`` near 0 (a loss whose advantages cancel, or the mean of a group's
    normalised advantages, is 0 up to the float32 rounding of its sum)."""
    names = [k for k in theirs if k.startswith(prefixes)]
    return {
        k: (mine.get(k), theirs[k])
        for k in names
        if mine.get(k) != pytest.approx(theirs[k], rel=rel, abs=near_0)
    }


def test_two_ranks_with_dynamic_batches_resume_as_the_unbroken_run(world):
    """DPH-JS (rehearsal controlled) and Lp-Reg on 2 ranks with dynamic batch sizes, fp32
    compute: 3 steps unbroken, and 1 step saved then resumed for steps 2 and 3. The resumed
    run continues the saved state (the rehearsal draw, the controller's eta and its warm-up
    count: eta first moves inside the resumed run) and each of its steps is the unbroken
    run's to 1e-6 (relative; near 0, 2e-7 absolute for the update, 1e-6 for the rollout's
    means): its rollout, its loss, gradient norm and DPH terms. Lp-Reg selects tokens here
    but regularises none (the default min-p ratio on the random model), so its term adds
    no gradient; where it acts, its selection per micro-batch follows verl's row order
    (measured in docs/verl.md, "Resume")."""
    root, model, data = world
    store = e2e.write_store(root / "store_ranks", model, data)
    exploration = root / "exploration_ranks.parquet"
    write_exploration_split(data, store, exploration)
    args = (root, model, exploration, *TWO_RANKS, *FP32_COMPUTE, f"+divrl.reference_store={store}")
    kw = {"reward": VARIED_REWARD}  # rewards that vary within a group: Lp-Reg has tokens
    _, unbroken = _run(*args, "trainer.total_training_steps=3", out=root / "unbroken", **kw)
    broken = root / "ranks_broken"
    _, first = _run(*args, "trainer.total_training_steps=1", out=broken, **kw)
    _, resumed = _run(*args, "trainer.total_training_steps=3", out=broken, **kw)
    assert [s["step"] for s in unbroken] == [1.0, 2.0, 3.0]
    assert [s["step"] for s in first] == [1.0] and [s["step"] for s in resumed] == [2.0, 3.0]
    for name in ("actor/dph/u_mean", "actor/lp_reg/num_selected", "actor/pg/loss"):
        assert all(name in s for s in unbroken), name
    assert any(s["actor/lp_reg/num_selected"] > 0 for s in unbroken)
    # the controller kept eta through its one warm-up step and moved it after step 2
    assert unbroken[0]["divrl/dph/eta"] == unbroken[1]["divrl/dph/eta"]
    assert unbroken[2]["divrl/dph/eta"] != unbroken[1]["divrl/dph/eta"]
    assert resumed[0]["divrl/rehearsal_drawn"] > first[0]["divrl/rehearsal_drawn"]
    # the comparison has something to compare: a gradient, a loss and, after step 1 (u = 1:
    # the store holds the start model's log-probs), a rehearsal likelihood away from 0
    assert all(s["actor/grad_norm"] > 0 for s in unbroken)
    assert all(abs(s["actor/dph/log_u_mean"]) > 1e-6 for s in unbroken[1:])
    assert any(abs(s["actor/pg_loss"]) > 1e-3 for s in resumed)
    for step, (mine, theirs) in enumerate(zip(first + resumed, unbroken, strict=True), 1):
        # near 0, float32 rounding of sums of terms of size ~1 that cancel (advantages of
        # both signs, log-probs against stored ones): at most 6.7e-8 apart (a loss of
        # 0.035) in 17 compared steps (docs/verl.md, "Resume")
        differing = _differing(mine, theirs, ROLLOUT_METRICS, 1e-6, 1e-6)
        differing.update(_differing(mine, theirs, ORDER_FREE, 1e-6, 2e-7))
        differing.update(_differing(mine, theirs, CONTROLLER, CONTROLLER_REL, 0.0))
        assert not differing, (step, differing)
    # 2 ranks' FSDP shards merged for divrl eval as verl's merger merges them
    assert_divrl_reads_verls_checkpoint(root / "unbroken", 3, root)


def test_two_ranks_with_fixed_one_row_micro_batches_train_dph_and_lp_reg(world):
    """Fixed micro-batches of one row on 2 ranks: each micro-batch holds a rollout row or a
    rehearsal row, never both, so a part's metrics would exist on some micro-batches only;
    every micro-batch logs every name (0 where it holds none of the part), so verl's
    aggregation over ranks takes them (it stopped the update when a rank logged fewer)."""
    root, model, data = world
    store = e2e.write_store(root / "store_fixed", model, data)
    exploration = root / "exploration_fixed.parquet"
    write_exploration_split(data, store, exploration)
    dynamic = ("use_dynamic_bsz", "max_token_len", "save_freq", "rehearsal_control")
    fixed = [a for a in TWO_RANKS if not any(d in a for d in dynamic)]
    _, steps = _run(
        root,
        model,
        exploration,
        *fixed,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        f"+divrl.reference_store={store}",
        out=root / "fixed",
        reward=VARIED_REWARD,
    )
    assert [s["step"] for s in steps] == [1.0, 2.0]
    for step in steps:
        for name in ("actor/dph/u_mean", "actor/lp_reg/num_selected", "actor/pg_loss"):
            assert step[name] == step[name], name  # logged, and not NaN
        assert step["actor/grad_norm"] > 0
        # a token mean of pi/pi_ref over the rehearsal rows: near 1 after a few small steps
        assert 0.5 < step["actor/dph/u_mean"] < 1.5


def test_remove_padding_trains_dph_and_lp_reg_as_the_padded_forward(world):
    """verl's packed forward (``use_remove_padding=True``) against its padded one, DPH-JS
    with Lp-Reg on one rank: the same 2 steps to float rounding. Micro-batches of one row
    keep the comparison true here: a packed row of several sequences needs flash-attention's
    variable-length kernel (no CPU build) to keep them apart, and with one sequence per row
    ``sdpa`` computes what that kernel would."""
    root, model, data = world
    store = e2e.write_store(root / "store_packed", model, data)
    exploration = root / "exploration_packed.parquet"
    write_exploration_split(data, store, exploration)
    one_row = [
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        *FP32_COMPUTE,  # the rows' order differs between runs (see the identity test)
        "actor_rollout_ref.rollout.n=4",
        "+divrl.divergence=js",
        "+divrl.divergence_coef=0.2",
        "+divrl.divergence_weighting=paper",
        "+divrl.reference_per_step=2",
        f"+divrl.reference_store={store}",
        "+divrl.policy_loss=lp_reg",
        "+divrl.loss_options.rho=0.5",
        "+divrl.loss_options.min_k=1",
        "actor_rollout_ref.actor.clip_ratio_low=1.0",
        "actor_rollout_ref.actor.clip_ratio_high=9.0",
    ]
    runs = {}
    for packed in (False, True):
        out = root / f"packed_{packed}"
        flag = f"actor_rollout_ref.model.use_remove_padding={packed}"
        _, runs[packed] = _run(
            root, model, exploration, *one_row, flag, out=out, reward=VARIED_REWARD
        )
    padded, packed = runs[False], runs[True]
    assert [s["step"] for s in padded] == [s["step"] for s in packed] == [1.0, 2.0]
    assert any(s["actor/lp_reg/num_selected"] > 0 for s in padded)
    for name in ("actor/dph/u_mean", "actor/dph/divergence", "actor/pg_loss"):
        assert all(name in s for s in padded), name
    for theirs, mine in zip(padded, packed, strict=True):
        compared = [k for k in theirs if k.startswith(("actor/", "critic/"))]
        differing = {
            k: (mine.get(k), theirs[k])
            for k in compared
            if "time" not in k
            and "memory" not in k
            and mine.get(k) != pytest.approx(theirs[k], rel=1e-4, abs=1e-6)
        }
        assert not differing, differing
