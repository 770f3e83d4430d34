"""Robustness of the TRL adapter: TRL's per-token loss modifiers are the ones the adapter
knows, an error on one rank ends every rank, hub-id models are fingerprinted."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

import trl

from divrl.integrations.trl_hooks import (
    TRL_LOSS_MODIFIERS,
    check_trl_internals,
    trl_loss_modifiers,
)


def test_trls_loss_modifiers_are_the_ones_the_adapter_knows():
    assert trl_loss_modifiers(trl.GRPOTrainer) == set(TRL_LOSS_MODIFIERS)

    class NewModifier(trl.GRPOTrainer):
        """A TRL whose loss gains a per-token factor and loses the entropy mask."""

        def _compute_loss(self, model, inputs):
            per_token_loss = inputs["loss"]
            if self.off_policy_mask_threshold is not None:
                per_token_loss = per_token_loss * off_policy_mask  # noqa: F821
            if (
                self.use_vllm
                and self.vllm_importance_sampling_correction
                and (self.loss_type != "vespo")
            ):
                per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
            if self.beta != 0.0:
                per_token_loss = per_token_loss + self.beta * per_token_kl  # noqa: F821
            if self.args.token_scale:
                per_token_loss = per_token_loss * self.args.token_scale
            return per_token_loss

    problems = check_trl_internals(NewModifier)
    assert any("per_token_loss = per_token_loss * self.args.token_scale" in p for p in problems)
    assert any(
        "no longer has `per_token_loss = per_token_loss * entropy_mask`" in p for p in problems
    )
    assert len(problems) == 2


@pytest.mark.slow
def test_an_error_on_one_rank_is_raised_on_every_rank(tmp_path, store, run_in_session):
    """Rank 1's Lp-Reg check fails inside TRL's forward; both ranks raise (rank 0 naming
    rank 1 and its message) instead of rank 0 waiting in the next collective."""
    import os
    import socket
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("dist_worker.py")
    out = tmp_path / "dist"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DIVRL_TEST_STORE": str(store)}
    env["PYTHONPATH"] = os.pathsep.join([str(worker.parent), env.get("PYTHONPATH", "")])
    env["DIVRL_TEST_FAIL_RANK"] = "1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    proc = run_in_session(
        [*cmd, "--master_port", str(port), str(worker), str(out)], env=env, timeout=240
    )
    assert proc.returncode != 0
    errors = [(out / f"rank{r}.error").read_text() for r in range(2)]
    assert "differs from TRL's log-probs" in errors[1]
    assert "failed on rank 1" in errors[0] and "differs from TRL's log-probs" in errors[0]


def fake_hub_cache(root, repo: str, model, tokenizer):
    """``repo`` in a Hugging Face cache layout under ``root`` (refs/main -> a snapshot)."""
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / "0123abcd"
    model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text("0123abcd")
    return snapshot


def test_hub_id_models_are_checked_by_their_cached_files(tmp_path, monkeypatch, store):
    """A model loaded by hub id is fingerprinted through its cached snapshot, so a store
    presampled from a copy of the same files passes and one of other files fails; a store
    presampled by hub id is checked by the name."""
    import huggingface_hub.constants as hub
    from trl_helpers import make_args, prompt_dataset, tiny_model, tiny_tokenizer, varied_reward

    from divrl.data.fingerprint import model_fingerprint
    from divrl.data.reference_store import ReferenceStore, StoreMismatchError, write_reference_store
    from divrl.integrations.trl import DivRLGRPOTrainer

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = fake_hub_cache(tmp_path / "hub", "org/tiny", tiny_model(0), tiny_tokenizer())
    local = tmp_path / "copy"  # the same files, presampled from a local folder
    tiny_model(0).save_pretrained(local)
    tiny_tokenizer().save_pretrained(local)
    assert model_fingerprint(local) == model_fingerprint(snapshot)
    samples = ReferenceStore(store)

    def store_with(model_print: str):
        manifest = {**samples.manifest, "fingerprint": {"model": model_print}}
        rows = [
            dict(zip(samples.prompts, r, strict=True))
            for r in zip(*samples.prompts.values(), strict=True)
        ]
        return write_reference_store(
            tmp_path / "s", samples.samples, rows, manifest, overwrite=True
        )

    def build():
        model = tiny_model(0)
        model.name_or_path = "org/tiny"  # as from_pretrained("org/tiny") sets it
        args = make_args(tmp_path, divergence="js", reference_store=str(tmp_path / "s"))
        return DivRLGRPOTrainer(
            model=model,
            reward_funcs=varied_reward,
            args=args,
            train_dataset=prompt_dataset(),
            processing_class=tiny_tokenizer(),
        )

    store_with(model_fingerprint(local))
    build()  # same files: passes
    tiny_model(7).save_pretrained(local)  # other weights
    store_with(model_fingerprint(local))
    with pytest.raises(StoreMismatchError, match="model"):
        build()
    store_with("name:org/other")  # presampled by another hub id
    with pytest.raises(StoreMismatchError, match="presampled from"):
        build()
    store_with("name:org/tiny")
    build()


@pytest.mark.slow
def test_lp_reg_proxy_under_fsdp2_equals_the_unsharded_one(tmp_path, run_in_session):
    """2 processes, gloo: the proxy the hook computes on a model whose layers and root are
    FSDP2 units (the head a DTensor shard between forwards) equals the unsharded one."""
    import json
    import os
    import socket
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("fsdp_proxy_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(worker.parent), env.get("PYTHONPATH", "")])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    out = tmp_path / "fsdp"
    proc = run_in_session(
        [*cmd, "--master_port", str(port), str(worker), str(out)], env=env, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in range(2):
        result = json.loads((out / f"rank{rank}.json").read_text())
        assert result["sharded"]
        after = torch.tensor(result["after"])
        torch.testing.assert_close(after, torch.tensor(result["before"]), rtol=0, atol=1e-6)
        assert torch.isfinite(after).any()
