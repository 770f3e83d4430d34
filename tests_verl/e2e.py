"""The tiny model, data and command of the end-to-end test (``test_main_ppo.py``)."""

from __future__ import annotations

import json
import os
import sys
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the prompt as a bare string: the toy tokenizer has no chat markup of its own
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
PROMPT_LENGTH = 128
RESPONSE_LENGTH = 16


def build_model(path: Path, seed: int = 0) -> Path:
    """A random 2-layer Llama over divrl's toy tokenizer (about 60K parameters)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from divrl.toy.tokenizer import build_tokenizer

    tok = build_tokenizer(model_max_length=PROMPT_LENGTH + RESPONSE_LENGTH)
    tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=PROMPT_LENGTH + RESPONSE_LENGTH,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_data(path: Path, n: int = 4) -> Path:
    """The first ``n`` rows of divrl's math fixture, in verl's parquet schema."""
    import pandas as pd

    text = resources.files("divrl.data").joinpath("fixtures", "math.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines()[:n]]
    pd.DataFrame(rows).to_parquet(path)
    return path


def env(metrics_file: Path | None = None) -> dict[str, str]:
    """The environment that loads the test-only CPU pieces in every verl process
    (``metrics_file``: where verl's file logger writes each step's metrics as JSON lines)."""
    extra = {"VERL_FILE_LOGGER_PATH": str(metrics_file)} if metrics_file else {}
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "VERL_USE_EXTERNAL_MODULES": "tests_verl.cpu_verl",
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_DEDUP_LOGS": "0",
        **extra,
    }


#: divrl's verifiers as verl's reward, by module name (verl's ``pkg://`` module paths)
REWARD = "pkg://divrl.integrations.verl.reward"


def command(model: Path, data: Path, out: Path, *extra: str, reward=None) -> list[str]:
    """``python -m verl.trainer.main_ppo`` for 2 GRPO steps of 2 prompts x 2 rollouts
    (``reward``: the reward function's file; by default divrl's verifiers, found by module
    name as docs/verl.md's command finds them)."""
    reward = reward or REWARD
    actor = "actor_rollout_ref.actor"
    return [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.train_batch_size=2",
        f"data.max_prompt_length={PROMPT_LENGTH}",
        f"data.max_response_length={RESPONSE_LENGTH}",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        f"{actor}.strategy=fsdp2",
        f"{actor}.ppo_mini_batch_size=2",
        f"{actor}.ppo_micro_batch_size_per_gpu=2",
        f"{actor}.use_kl_loss=False",
        f"{actor}.optim.lr=1e-3",
        f"{actor}.fsdp_config.param_offload=False",
        f"{actor}.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.name=cpu_hf",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.load_format=auto",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        f"reward.custom_reward_function.path={reward}",
        "reward.custom_reward_function.name=compute_score",
        "reward.num_workers=1",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={out}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "+ray_kwargs.ray_init.num_cpus=16",
        "+ray_kwargs.ray_init.num_gpus=1",
        "+ray_kwargs.ray_init.include_dashboard=False",
        *extra,
    ]


def write_store(path: Path, model_path: Path, data: Path, n: int = 2) -> Path:
    """A reference store of ``n`` samples of the tiny model on the data's prompts (the
    prompts as verl tokenizes them), with their log-probs at temperature 1."""
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from divrl.data.reference_store import ReferenceSample, write_reference_store

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    rows = pd.read_parquet(data).to_dict("records")
    torch.manual_seed(0)
    samples, prompts = [], []
    for i, row in enumerate(rows):
        pid = str(row["extra_info"]["index"])
        near_perfect = i < n
        prompts.append(
            {
                "prompt_id": pid,
                "n_correct": 8 if near_perfect else 0,
                "has_reference": near_perfect,
                "split": "near_perfect" if near_perfect else "exploration",
            }
        )
        if not near_perfect:
            continue
        text = tok.apply_chat_template(
            list(row["prompt"]), tokenize=False, add_generation_prompt=True
        )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            seq = model.generate(
                torch.tensor([ids]),
                do_sample=True,
                max_new_tokens=RESPONSE_LENGTH,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.eos_token_id,
            )[0]
            logits = model(seq[None]).logits[0, len(ids) - 1 : -1]
        response = seq[len(ids) :]
        lp = logits.log_softmax(-1).gather(-1, response[:, None])[:, 0]
        samples.append(ReferenceSample(pid, ids, response.tolist(), lp.tolist()))
    write_reference_store(path, samples, prompts, {"log_prob_temperature": 1.0})
    return path


def step_metrics(metrics_file: Path) -> list[dict[str, float]]:
    """The per-step metrics verl's file logger wrote, one dict per logged step with its
    ``step``. Read from the file, not the console: Ray forwards a worker's printed lines to
    the driver and may repeat one, so the console is not an exact record of the steps."""
    steps = []
    for line in Path(metrics_file).read_text().splitlines():
        record = json.loads(line)
        steps.append({"step": float(record["step"]), **record["data"]})
    return steps


def checkpoint_files(folder: Path) -> list[str]:
    """The files of a checkpoint folder, relative to it, sorted."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
