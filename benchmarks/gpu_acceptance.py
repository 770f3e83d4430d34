"""GPU acceptance: every rollout-engine path of divrl on one GPU, in minutes, no downloads.

    python -m benchmarks.gpu_acceptance [--out DIR] [--only CASE ...]   # or benchmarks/gpu_acceptance.sh

Models are built on the machine: the toy world's base model (shipped in the package) and
a randomly initialised Qwen2 of the Qwen2.5-0.5B shape (494M parameters, 151,936-token
vocabulary, a character tokenizer padded to that size). Each case runs in its own process
(``torchrun --nproc_per_node 1`` where a process group is needed), so its peak CUDA memory
and a crash are its own; the vLLM cases print SKIP where vLLM is not installed. The last
lines are a table, one row per case: PASS/FAIL/SKIP, peak CUDA memory, wall time, the
timed step, and what the case must show with what it showed. Results: ``DIR/*.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QWEN_VOCAB = 151_936
# --smoke: the script's own plumbing on a CPU in a minute or two (tiny shapes, no CUDA)
SMOKE = os.environ.get("DIVRL_ACCEPTANCE_SMOKE") == "1"
TOY_PROMPTS = 8 if SMOKE else 64
EVAL_N = 4 if SMOKE else 64
NEW_TOKENS = 16 if SMOKE else 128


def _vllm_version() -> str | None:
    try:
        import vllm
    except ImportError:
        return None
    return getattr(vllm, "__version__", "?")


# --------------------------------------------------------------------------- models


def build_qwen2(path: Path) -> int:
    """A random-init Qwen2 (Qwen2.5-0.5B's shape) and a 151,936-token character tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    vocab.update({f"<t{i}>": i for i in range(len(vocab), QWEN_VOCAB)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    shape = (
        {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1}
        if SMOKE
        else {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
              "num_attention_heads": 14, "num_key_value_heads": 2}
    )  # fmt: skip
    config = Qwen2Config(
        vocab_size=QWEN_VOCAB, max_position_embeddings=4096, rope_theta=1_000_000.0,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=1, **shape,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cpu" if SMOKE else "cuda"):
        model = Qwen2ForCausalLM(config).to(torch.float32 if SMOKE else torch.bfloat16)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def _overrides(work: Path, model: Path, data: Path, name: str, *extra: str) -> list[str]:
    return [
        f"model.path={model}", f"data.train_path={data}", "data.max_prompt_length=64",
        f"data.limit={TOY_PROMPTS}", "train.prompts_per_step=8", "rollout.n=8",
        f"rollout.max_new_tokens={NEW_TOKENS}", "train.micro_batch_size=16", "train.total_steps=2",
        "optim.lr=1e-3", "optim.warmup_steps=0", f"logging.output_dir={work / name}",
        "logging.tensorboard=false", "logging.progress=false", "checkpoint.save_every=0",
        "checkpoint.save_final=false", *extra,
    ]  # fmt: skip


def _train(overrides: list[str], before=None) -> tuple[object, list[dict], list[float]]:
    """Train; (trainer, metrics per step, step seconds); ``before(trainer)`` runs first."""
    from benchmarks.step_time import reward_fn
    from divrl.training.config import load_config
    from divrl.training.trainer import Trainer

    trainer = Trainer(load_config(None, overrides), reward_fn=reward_fn)
    if before is not None:
        before(trainer)
    history, times = [], []
    for _ in range(2):
        t0 = time.perf_counter()
        history.append(trainer.train_step())
        times.append(time.perf_counter() - t0)
    return trainer, history, times


# --------------------------------------------------------------------------- cases


def case_env(work: Path) -> dict:
    import torch
    import transformers

    ok = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if ok else "no CUDA device"
    bf16 = ok and torch.cuda.is_bf16_supported()
    shows = f"{name}; torch {torch.__version__}, transformers {transformers.__version__}"
    return {"ok": SMOKE or (ok and bf16), "shows": f"{shows}; bf16={bf16}; vLLM {_vllm_version()}"}


def case_build(work: Path) -> dict:
    from divrl.toy import ensure_toy_world

    world = ensure_toy_world(work / "toycache", size="full", progress=False)
    (work / "paths.json").write_text(json.dumps({
        "toy_model": str(world.model_dir), "toy_train": str(world.splits["train"]),
        "toy_test": str(world.splits["test"]), "qwen2": str(work / "qwen2"),
    }))  # fmt: skip
    params = build_qwen2(work / "qwen2")
    return {
        "ok": SMOKE or 0.45e9 < params < 0.55e9,
        "shows": f"toy world; Qwen2 {params / 1e9:.3f}B params, vocab {QWEN_VOCAB}",
    }


def _paths(work: Path) -> dict:
    return json.loads((work / "paths.json").read_text())


def case_train_toy_hf(work: Path) -> dict:
    p = _paths(work)
    over = _overrides(work, p["toy_model"], p["toy_train"], "toy_hf", "rollout.engine=hf")
    _, history, times = _train(over)
    ok = all(math.isfinite(h["loss/total"]) for h in history)
    return {"ok": ok, "step_s": times[-1], "shows": f"losses {_losses(history)}"}


def case_fsdp_qwen2(work: Path) -> dict:
    import torch

    p = _paths(work)
    dtype = "float32" if SMOKE else "bfloat16"
    extra = ("train.strategy=fsdp", f"train.param_dtype={dtype}", "rollout.engine=hf")
    trainer, history, times = _train(_overrides(work, p["qwen2"], p["toy_train"], "fsdp", *extra))
    from divrl.training.fsdp import is_fsdp

    sharded = is_fsdp(trainer.policy)
    finite = all(math.isfinite(h["loss/total"]) for h in history)
    grad = [h.get("actor/grad_norm", float("nan")) for h in history]
    del trainer
    torch.distributed.barrier()
    return {
        "ok": sharded and finite and all(math.isfinite(g) and g > 0 for g in grad),
        "step_s": times[-1],
        "shows": f"FSDP2={sharded}; losses {_losses(history)}; grad norms {_fmt(grad)}",
    }


def case_vllm_train_sync(work: Path) -> dict:
    """vLLM rollouts + a training step + weight sync: the next rollout must change, and
    vLLM's log-probs of it must equal the trained policy's (the sync loaded every tensor)."""
    import torch

    from divrl.rollout import SamplingParams
    from divrl.training.forward import batch_log_probs

    p = _paths(work)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=32)
    seen = {}

    def before(trainer):
        seen["prompts"] = [x.prompt_ids for x in trainer.prompts[:8]]
        seen["before"] = trainer.engine.generate(seen["prompts"], greedy).response_ids

    extra = (
        "rollout.engine=vllm", "model.dtype=bfloat16",
        "rollout.engine_options.gpu_memory_utilization=0.3",
        "rollout.engine_options.enforce_eager=true",
    )  # fmt: skip
    over = _overrides(work, p["qwen2"], p["toy_train"], "vllm_train", *extra)
    trainer, history, times = _train(over, before)
    after = trainer.engine.generate(seen["prompts"], greedy)
    changed = sum(a != b for a, b in zip(after.response_ids, seen["before"], strict=True))
    with torch.no_grad():
        ref = batch_log_probs(
            trainer.policy, after.prompt_ids, after.response_ids, pad_token_id=trainer.pad_id,
            temperature=1.0, micro_batch_size=8,
        )  # fmt: skip
    pairs = zip(after.log_probs, ref, strict=True)
    gap = max(abs(a - b) for x, y in pairs for a, b in zip(x, y, strict=True))
    return {
        "ok": changed > 0 and gap < 0.15 and all(math.isfinite(h["loss/total"]) for h in history),
        "step_s": times[-1],
        "shows": f"{changed}/8 greedy rollouts changed after the sync; max |vLLM - policy| "
        f"log-prob {gap:.3f} (< 0.15, bf16)",
    }


def _eval(work: Path, engine: str, *extra: str) -> dict:
    from divrl.cli import main

    p, out = _paths(work), work / f"eval_{engine}"
    argv = [
        "eval", "--model", p["toy_model"], "--data", f"test={p['toy_test']}", "--out", str(out),
        "--n", str(EVAL_N), "--limit", str(TOY_PROMPTS), "--no-progress", "--n-boot", "100",
        "--engine", engine, *extra,
    ]  # fmt: skip
    if main(argv) != 0:
        return {"ok": False, "shows": "divrl eval failed"}
    s = json.loads((out / "test" / "summary.json").read_text())
    seconds = s["timings"]["sampling_seconds"]
    shows = (
        f"{s['n_prompts']} prompts x {EVAL_N}: greedy {s['greedy_accuracy']:.3f}, "
        f"P@1 {s['pass@k']['1']:.3f}, P@{EVAL_N} {s['pass@k'][str(EVAL_N)]:.3f}; "
        f"sampling {seconds:.1f} s"
    )
    ok = s["n_prompts"] == TOY_PROMPTS and str(EVAL_N) in s["pass@k"]
    return {"ok": ok, "step_s": seconds, "shows": shows, "greedy": s["greedy_accuracy"]}


def case_eval_hf(work: Path) -> dict:
    return _eval(work, "hf", "--batch-size", "16")


def case_eval_vllm(work: Path) -> dict:
    opts = ("dtype=float32", "gpu_memory_utilization=0.5", "enforce_eager=true")
    out = _eval(work, "vllm", "--batch-size", "64", *[f"--engine-option={o}" for o in opts])
    hf_file = work / "eval-hf.json"
    if out["ok"] and hf_file.is_file():  # greedy decoding: both engines should agree
        hf = json.loads(hf_file.read_text())
        out["ok"] = abs(out["greedy"] - hf["greedy"]) <= 0.05
        out["shows"] += f"; hf greedy {hf['greedy']:.3f}, hf sampling {hf['step_s']:.1f} s"
    return out


def case_presample_vllm(work: Path) -> dict:
    from divrl.training.config import load_config
    from divrl.training.presample import presample

    p = _paths(work)
    extra = (
        "rollout.engine=vllm", f"reference.store={work / 'store'}", "reference.k=8",
        "rollout.engine_options.gpu_memory_utilization=0.5",
        "rollout.engine_options.enforce_eager=true",
    )  # fmt: skip
    config = load_config(None, _overrides(work, p["toy_model"], p["toy_train"], "pre", *extra))
    t0 = time.perf_counter()
    stats = presample(config, progress=False)["stats"]
    seconds = time.perf_counter() - t0
    return {
        "ok": stats["prompts"] == TOY_PROMPTS,
        "step_s": seconds,
        "shows": f"{stats['prompts']} prompts x 8: {stats['near_perfect']} near-perfect, "
        f"{stats['exploration']} exploration",
    }


def _losses(history: list[dict]) -> str:
    return _fmt([h["loss/total"] for h in history])


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


# name -> (function, needs vLLM, needs a process group, what it must show)
CASES = {
    "env": (case_env, False, False, "a CUDA device with bf16"),
    "build": (case_build, False, False, "toy world + 0.5B Qwen2 built locally"),
    "train-toy-hf": (case_train_toy_hf, False, False, "hf rollouts + GRPO steps, finite"),
    "fsdp-bf16-qwen2": (case_fsdp_qwen2, False, True, "FSDP2 on 1 GPU, bf16, grads > 0"),
    "eval-hf-n64": (case_eval_hf, False, False, f"divrl eval n={EVAL_N}, summary complete"),
    "vllm-train-sync": (case_vllm_train_sync, True, True, "next rollout changes after sync"),
    "eval-vllm-n64": (case_eval_vllm, True, False, "n=64 summary; greedy = hf's (+-0.05)"),
    "presample-vllm": (case_presample_vllm, True, False, "reference store from vLLM"),
}


# --------------------------------------------------------------------------- driver


def child(name: str, work: Path) -> None:
    """Run one case in this process; write ``work/NAME.json`` (its peak CUDA memory too)."""
    import torch

    torch.cuda.reset_peak_memory_stats() if torch.cuda.is_available() else None
    t0 = time.perf_counter()
    result = CASES[name][0](work)
    result["seconds"] = time.perf_counter() - t0
    if torch.cuda.is_available():
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        (work / f"{name}.json").write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _launch(name: str, work: Path, timeout: float) -> dict:
    """The case in a fresh process (torchrun with one rank where it needs a group)."""
    module = ["-m", "benchmarks.gpu_acceptance", "--case", name, "--work", str(work)]
    if CASES[name][2]:
        # torchrun as a module: the image's python may not have the script beside it
        launcher = [sys.executable, "-m", "torch.distributed.run"]
        cmd = [*launcher, "--standalone", "--nproc_per_node", "1", *module]
    else:
        cmd = [sys.executable, *module]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    log = work / f"{name}.log"
    t0 = time.perf_counter()
    with log.open("w") as f:  # a session of its own: a timeout kills torchrun's rank too
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"ok": False, "shows": f"ran past {timeout:.0f} s (log: {log})"}
    result_file = work / f"{name}.json"
    if rc != 0 or not result_file.is_file():
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return {"ok": False, "seconds": time.perf_counter() - t0,
                "shows": f"exit {rc}: {tail[0][:150]} (log: {log})"}  # fmt: skip
    return json.loads(result_file.read_text())


def table(rows: list[tuple[str, str, dict]]) -> str:
    """One screen: case, result, peak CUDA GiB, wall s, timed s, must show -> showed."""
    lines = [f"{'case':<17} {'result':<6} {'peak GiB':>8} {'wall s':>7} {'step s':>7}  check"]
    for name, status, r in rows:
        peak = f"{r['peak_gib']:.1f}" if "peak_gib" in r else "-"
        wall = f"{r['seconds']:.0f}" if "seconds" in r else "-"
        step = f"{r['step_s']:.2f}" if "step_s" in r else "-"
        lines.append(f"{name:<17} {status:<6} {peak:>8} {wall:>7} {step:>7}  {CASES[name][3]}")
        lines.append(f"{'':<50}-> {r['shows']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_acceptance"))
    parser.add_argument("--only", nargs="*", choices=sorted(CASES), help="run these cases")
    parser.add_argument("--timeout", type=float, default=200, help="seconds per case")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes on the CPU: checks the script itself"
    )
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        child(args.case, Path(args.work))
        return 0
    if args.smoke and not SMOKE:  # the shapes are read at import: rerun with the variable
        env = {**os.environ, "DIVRL_ACCEPTANCE_SMOKE": "1"}
        cmd = [sys.executable, "-m", "benchmarks.gpu_acceptance", *(argv or sys.argv[1:])]
        return subprocess.run(cmd, cwd=ROOT, env=env).returncode
    work = Path(args.out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    vllm = _vllm_version()
    rows = []
    for name, (_, needs_vllm, _, _) in CASES.items():
        if args.only and name not in args.only and name not in ("env", "build"):
            continue
        if needs_vllm and vllm is None:
            print(f"[gpu-acceptance] {name}: SKIP (vLLM is not installed)", flush=True)
            rows.append((name, "SKIP", {"shows": "vLLM not installed: pip install "
                                        "'vllm>=0.20.0,<0.35' to run this case"}))  # fmt: skip
            continue
        print(f"[gpu-acceptance] {name} ...", flush=True)
        result = _launch(name, work, args.timeout)
        rows.append((name, "PASS" if result.get("ok") else "FAIL", result))
    report = table(rows)
    print("\ndivrl GPU acceptance (not a benchmark: each case checks what it must show)")
    print(report)
    (work / "acceptance.txt").write_text(report + "\n")
    return 0 if all(status != "FAIL" for _, status, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
