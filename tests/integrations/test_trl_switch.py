"""The five-line switch: DPH-RL's exploration split taken from the store by the trainer,
the README's TRL example run as printed, the store's token ids checked against the model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from trl_helpers import (
    PROMPTS,
    count_ones_reward,
    make_args,
    prompt_dataset,
    tiny_model,
    tiny_tokenizer,
    write_store,
)

pytest.importorskip("trl")

from divrl.data.reference_store import ReferenceStoreError
from divrl.integrations.trl import DivRLGRPOTrainer

ROOT = Path(__file__).resolve().parents[2]
EXPLORATION = 2  # the last prompts of the tiny store are exploration prompts


@pytest.fixture(scope="module")
def split_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("split") / "store"
    return write_store(path, tiny_model(0), tiny_tokenizer(), exploration=EXPLORATION)


def trainer(args, dataset, model=None):
    return DivRLGRPOTrainer(
        model=model if model is not None else tiny_model(0),
        reward_funcs=count_ones_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tiny_tokenizer(),
    )


def test_dph_rolls_out_only_the_stores_exploration_prompts(tmp_path, split_store):
    dph = {"divergence": "js", "reference_store": str(split_store)}
    args = make_args(tmp_path, rollout_prompts="exploration", **dph)
    kept = trainer(args, prompt_dataset(with_ids=True)).train_dataset
    exploration = [f"p{i}" for i in range(len(PROMPTS) - EXPLORATION, len(PROMPTS))]
    assert kept["prompt_id"] == exploration
    everything = trainer(make_args(tmp_path, **dph), prompt_dataset(with_ids=True))
    assert len(everything.train_dataset) == len(PROMPTS)  # rollout_prompts="all"
    # a dataset of prompts alone: found in the store by the prompts themselves
    assert trainer(args, prompt_dataset()).train_dataset["prompt_id"] == exploration
    with pytest.raises(ValueError, match=r"'prompt_id' column .* rollout_prompts='all'"):
        trainer(args, prompt_dataset().rename_column("prompt", "text"))
    with pytest.raises(ValueError, match="rollout_prompts='bogus': use one of"):
        make_args(tmp_path, rollout_prompts="bogus")


def test_store_token_ids_are_checked_against_the_models_vocabulary(tmp_path, split_store):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = tiny_model(0).config.to_dict()
    config["vocab_size"] = 8  # the store's digits are ids 3..15
    small = LlamaForCausalLM(LlamaConfig(**config))
    args = make_args(tmp_path, divergence="js", reference_store=str(split_store))
    with pytest.raises(ReferenceStoreError, match="token ids"):
        trainer(args, prompt_dataset(), model=small)


def readme_switch() -> str:
    """The README's TRL example after the switch: its diff without the removed lines."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Using divrl inside TRL") :]
    (diff,) = re.findall(r"```diff\n(.*?)```", section, flags=re.S)[:1]
    lines = [line for line in diff.splitlines() if not line.startswith("-")]
    return "\n".join(line[1:] for line in lines) + "\n"


@pytest.mark.slow
def test_the_readme_switch_runs_as_printed(tmp_path, monkeypatch):
    """The README's lines run unchanged, with GRPOConfig's defaults (bf16 included: the
    test lets transformers take this CPU for bf16, which autocast supports), on a store
    at the README's path; the trainer rolls out the exploration prompts only and ends
    the run itself."""
    import transformers.training_args as training_args

    monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    # a model folder with its tokenizer, which GRPOTrainer loads (no processing_class given)
    tiny_model(0, max_positions=512).save_pretrained("model")  # 256 completion tokens fit
    tiny_tokenizer().save_pretrained("model")
    model = AutoModelForCausalLM.from_pretrained("model")
    write_store(Path("runs/toy/dph_reference"), model, tiny_tokenizer(), exploration=1)
    namespace = {
        "model": model,
        "reward_fn": count_ones_reward,
        "dataset": prompt_dataset(with_ids=True),
    }
    code = readme_switch()
    assert 'reference_store="runs/toy/dph_reference"' in code
    exec(compile(code, "README.md", "exec"), namespace)
    trained = namespace["trainer"]
    assert trained.args.bf16 and trained.args.max_steps == -1  # GRPOConfig's defaults
    assert trained.train_dataset["prompt_id"] == [f"p{len(PROMPTS) - 1}"]
    assert trained.state.global_step > 0
    logged = [h for h in trained.state.log_history if "divrl/dph/divergence" in h]
    assert logged and all(abs(h["divrl/dph/divergence"]) < 1.0 for h in logged)


@pytest.mark.parametrize(("bf16", "max_tol", "mean_tol"), [(False, 1e-5, 1e-6), (True, 0.25, 0.05)])
def test_u_at_step_zero_under_bf16_autocast(tmp_path, split_store, bf16, max_tol, mean_tol):
    """u = pi_theta / pi_ref on the reference samples before any update, scored as the DPH
    term scores them (TRL's log-prob pass under the trainer's autocast) against the fp32
    log-probs of the store: exactly 1 in fp32; under bf16 autocast within exp(+-0.25) per
    token and exp(0.05) on average (measured on the six samples of the full tiny store:
    max |log u| 0.156, mean 0.023; this model's wide initialisation makes its logits
    large)."""

    args = make_args(
        tmp_path,
        divergence="js",
        reference_store=str(split_store),
        reference_batch_size=len(PROMPTS) - EXPLORATION,  # every stored sample
        bf16=bf16,
    )
    trained = trainer(args, prompt_dataset(), model=tiny_model(0))
    assert trained.accelerator.mixed_precision == ("bf16" if bf16 else "no")
    batch = trained._draw_reference()
    with trained.compute_loss_context_manager():
        logps, _, _ = trained._get_per_token_logps_and_entropies(
            trained.model, batch.input_ids, batch.attention_mask, batch.logits_to_keep
        )
    log_u = (logps.gather(1, batch.columns).float() - batch.ref_log_probs) * batch.mask
    assert float(log_u.abs().max()) < max_tol
    assert float(log_u.abs().sum() / batch.mask.sum()) < mean_tol
