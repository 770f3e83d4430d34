"""Helpers of the training tests: a tiny random Llama with a character-level tokenizer, a
toy prompt set, rewards and config overrides."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import torch

CHARS = list("0123456789+=;:QA ")


def build_tiny_lm(path: Path, seed: int = 0) -> Path:
    from tokenizers import Tokenizer, decoders, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_prompts(path: Path, n: int = 16) -> Path:
    rows = [
        {
            "data_source": "math",
            "prompt": f"Q:{i}+{i + 1}=",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i + 1)},
            "extra_info": {"index": f"p{i}"},
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sevens_reward(requests):
    """1.0 when the response contains a '7': learnable by a random tiny model."""
    return [float("7" in r.solution_str) for r in requests]


def parity_reward(requests):
    """1.0 for every response to an even-numbered prompt, 0.0 for odd ones (ground truth
    2i+1: even i <=> (gt - 1) / 2 even): an exact, model-independent split for DPH tests."""
    return [float(((int(r.ground_truth) - 1) // 2) % 2 == 0) for r in requests]


def tiny_overrides(world, out_dir, **extra) -> list[str]:
    base = {
        "model.path": world["model"],
        "data.train_path": world["data"],
        "logging.output_dir": str(out_dir),
        "logging.progress": False,
        "logging.tensorboard": False,
        "train.total_steps": 3,
        "train.prompts_per_step": 4,
        "train.micro_batch_size": 8,
        "rollout.n": 4,
        "rollout.max_new_tokens": 6,
        "optim.lr": 0.01,
        "checkpoint.save_every": 0,
        "checkpoint.save_final": False,
    }
    base.update(extra)
    return [f"{k}={'null' if v is None else v}" for k, v in base.items()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun(worker: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 worker *args`` on CPU (gloo), one torch thread per
    process, this checkout first on the path; the finished process (not checked)."""
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), env.get("PYTHONPATH", "")])
    return run_in_session(
        [
            *(str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1"),
            *("--master_port", str(free_port()), str(worker), *args),
        ],
        env=env,
        timeout=timeout,
    )


def run_in_session(cmd: list[str], *, timeout: int, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` in a session of its own. On a
    timeout the whole session is killed, a launcher's ranks too (``subprocess.run`` kills
    the launcher alone and leaves hung ranks behind), and the test fails with the output's
    tail."""
    import pytest

    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(
            f"{' '.join(cmd)[:300]} ran past {timeout} s; its session was killed\n"
            f"stdout: {out[-2000:]}\nstderr: {err[-3000:]}"
        )
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
