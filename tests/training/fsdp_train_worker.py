"""Run by tests/training/test_fsdp_trainer.py under ``torchrun --nproc_per_node 2``: the
trainer with ``train.strategy=fsdp`` on the cases of ``<out>/cases.json``, one after
another in this one process group. A ``"presample"`` case runs ``divrl presample`` (rows
split over the ranks, the store written once). For each training case ``<name>``, rank 0
writes:

- ``<name>/params.pt``: the full parameters after training (``iter_full_parameters``);
- ``<name>/history.json``: the metric history;
- ``<name>/forwards.json``: calls of ``response_logits`` during training (each a forward
  of the policy or reference model in the update stage);
- with ``"kill_at"``: the run is stopped after that step (an exception in ``on_step``), the
  run directory copied to ``<name>_copy`` (for the 2 -> 1 resume test) and resumed;
  ``resumed_step.json`` says where it picked up;
- with ``"vllm"``: what a stand-in vLLM received from ``Trainer._sync_engine`` after the
  sharded steps (``vllm_received.pt``), and the greedy tokens of the trained model from
  the hf engine (inside ``full_parameters``) on each rank (``greedy_rank<r>.json``), and
  whether the TRL adapter's Lp-Reg head check refused the FSDP2-sharded head
  (``lm_head_refused_rank<r>.json``).
"""

import contextlib
import json
import shutil
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from train_helpers import parity_reward, sevens_reward

import divrl.training.update as update_mod
from divrl.distributed import release_process_group
from divrl.integrations.trl_lp_reg import full_lm_head
from divrl.rollout import SamplingParams
from divrl.training.config import load_config
from divrl.training.fsdp import is_fsdp, iter_full_parameters
from divrl.training.presample import presample
from divrl.training.trainer import Trainer

GREEDY_PROMPT = [1, 5, 6, 7]


class Killed(Exception):
    pass


def _stand_in_vllm(received: list) -> None:
    """A ``vllm`` module whose LLM records what ``load_weights`` reads (copies)."""

    class FakeLLM:
        def __init__(self, **kwargs):
            pass

        def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            (weights,) = args  # vLLM's in-process worker reads the iterator itself
            received.extend((n, t.clone()) for n, t in weights)
            return [len(received)]

        def reset_prefix_cache(self):
            pass

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = FakeLLM, object
    vllm.__version__ = "0.34.0"  # within the supported range (pyproject's vllm extra)
    sys.modules["vllm"] = vllm


def _vllm_and_greedy(trainer: Trainer, out: Path) -> None:
    from divrl.rollout.vllm import VLLMEngine

    received: list = []
    _stand_in_vllm(received)
    hf_engine = trainer.engine
    trainer.engine = VLLMEngine("unused", gpu_memory_utilization=0.1, dtype="float32", seed=0)
    trainer._sync_engine()  # every rank consumes the gathering iterator
    trainer.engine = hf_engine
    if trainer.rank == 0:
        torch.save(dict(received), out / "vllm_received.pt")
    try:  # the TRL adapter's Lp-Reg head read refuses an FSDP2 shard
        full_lm_head(trainer.model)
        refused = False
    except ValueError:
        refused = True
    (out / f"lm_head_refused_rank{trainer.rank}.json").write_text(json.dumps(refused))
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    tokens = hf_engine.generate([GREEDY_PROMPT], greedy).response_ids[0]
    (out / f"greedy_rank{trainer.rank}.json").write_text(json.dumps(tokens))


def run_case(case: dict, root: Path) -> None:
    out = root / case["name"]
    out.mkdir(exist_ok=True)
    overrides = case["overrides"]
    calls = []
    real = update_mod.response_logits
    update_mod.response_logits = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        trainer = Trainer(load_config(None, overrides), reward_fn=sevens_reward)
        assert is_fsdp(trainer.model), "train.strategy=fsdp on 2 processes must shard"
        if "kill_at" in case:
            trainer = _kill_and_resume(trainer, case, overrides, root)
            (out / "resumed_step.json").write_text(json.dumps(trainer.step))
        history = trainer.train()
    finally:
        update_mod.response_logits = real
    params = {n: t.clone() for n, t in iter_full_parameters(trainer.model, with_buffers=False)}
    if trainer.rank == 0:
        torch.save(params, out / "params.pt")
        (out / "history.json").write_text(json.dumps(history))
        (out / "forwards.json").write_text(json.dumps(len(calls)))
    if case.get("vllm"):
        _vllm_and_greedy(trainer, out)
    dist.barrier()


def _kill_and_resume(trainer: Trainer, case: dict, overrides: list, root: Path) -> Trainer:
    def kill(step, record):
        if step == case["kill_at"]:
            raise Killed

    with contextlib.suppress(Killed):
        trainer.train(on_step=kill)
    dist.barrier()
    run_dir = Path(trainer.run.root)
    if trainer.rank == 0:
        shutil.copytree(run_dir, root / f"{case['name']}_copy" / "run")
    dist.barrier()
    return Trainer(load_config(None, overrides), reward_fn=sevens_reward, resume=True)


def main() -> None:
    torch.set_num_threads(1)
    root = Path(sys.argv[1])
    for case in json.loads((root / "cases.json").read_text()):
        if case.get("presample"):
            presample(load_config(None, case["overrides"]), reward_fn=parity_reward, progress=False)
        else:
            run_case(case, root)
    # the trainers are gone: end the group while the interpreter is whole (divrl train's end)
    release_process_group()


if __name__ == "__main__":
    main()
