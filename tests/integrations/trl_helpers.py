"""Tiny things for the TRL integration tests: a char-level tokenizer, a 2-layer Llama, a
prompt set, rewards and a DPH reference store, all built in the test (CPU, fp32).

A uniquely named module (not conftest) so the tests and the torchrun worker import it
unambiguously."""

from __future__ import annotations

from pathlib import Path

import torch

CHARS = list("0123456789+= ")
PROMPTS = [f"{a}+{b}=" for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4)]]


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )


def tiny_model(seed: int = 0, max_positions: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=3 + len(CHARS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        # wider than the default 0.02, so next-token distributions are far from uniform
        initializer_range=0.3,
    )
    return LlamaForCausalLM(cfg).float()


def count_ones_reward(completions, **kwargs) -> list[float]:
    return [float(c.count("1")) for c in completions]


def varied_reward(completions, **kwargs) -> list[float]:
    """Differs between completions of one prompt, so most groups have advantages."""
    return [float(sum(ord(ch) % 3 for ch in c)) for c in completions]


def prompt_dataset(with_ids: bool = False):
    """The prompts; ``with_ids``: with a ``prompt_id`` column, the ids :func:`write_store`
    gives them."""
    from datasets import Dataset

    ids = {"prompt_id": [f"p{i}" for i in range(len(PROMPTS))]} if with_ids else {}
    return Dataset.from_dict({"prompt": PROMPTS, **ids})


def write_store(
    path: Path, model, tokenizer, seed: int = 0, temperature: float = 1.0, exploration: int = 0
) -> Path:
    """A reference store of random responses (lengths 2 to 6) to every prompt, with their
    log-probs under ``model``, each computed on its own unpadded sequence. The last
    ``exploration`` prompts are exploration prompts (their samples left out)."""
    from divrl.algorithms import token_log_probs
    from divrl.data.reference_store import ReferenceSample, write_reference_store

    gen = torch.Generator().manual_seed(seed)
    samples = []
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            prompt_ids = tokenizer(prompt)["input_ids"]
            length = int(torch.randint(2, 7, (1,), generator=gen))
            response = torch.randint(3, 3 + len(CHARS), (length,), generator=gen).tolist()
            ids = torch.tensor([prompt_ids + response])
            logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
            lp = token_log_probs(logits, torch.tensor(response), temperature)
            samples.append(
                ReferenceSample(
                    f"p{i}", prompt_ids, response, lp.tolist(), tokenizer.decode(response)
                )
            )
    near = len(samples) - exploration
    prompts = [
        {"prompt_id": s.prompt_id, "n_correct": 8, "split": "near_perfect", "has_reference": True}
        for s in samples[:near]
    ] + [
        {"prompt_id": s.prompt_id, "n_correct": 0, "split": "exploration", "has_reference": False}
        for s in samples[near:]
    ]
    from divrl.data.fingerprint import prompt_key

    for row, prompt in zip(prompts, PROMPTS, strict=True):  # as presample records them
        row["prompt_key"] = prompt_key(prompt)
    samples = samples[:near]
    manifest = {"model": "tiny", "log_prob_temperature": temperature}
    return write_reference_store(path, samples, prompts, manifest)


def make_args(tmp_path: Path, **overrides):
    from divrl.integrations.trl import DivRLGRPOConfig

    kwargs = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        bf16=False,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        seed=0,
        disable_dropout=True,
        # the tests' prompt set has no prompt ids: roll out every prompt under DPH-RL
        rollout_prompts="all",
    )
    kwargs.update(overrides)
    return DivRLGRPOConfig(**kwargs)
