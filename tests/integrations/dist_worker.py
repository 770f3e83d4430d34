"""Worker of the 2-process test: `torchrun --nproc_per_node 2 dist_worker.py OUT_DIR`.

Trains 2 steps with DPH-JS and Lp-Reg on (gloo, CPU) and writes ``OUT_DIR/rank<r>.json``;
the trainer's own end at exit writes ``OUT_DIR/rank<r>.end.json``. With
``DIVRL_TEST_FAIL_RANK=r`` rank r's Lp-Reg consistency check fails; each rank writes the
error it raised to ``OUT_DIR/rank<r>.error``.
"""

from __future__ import annotations

import json
import os
import sys
import weakref
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

torch.set_num_threads(1)

from trl_helpers import (  # noqa: E402
    make_args,
    prompt_dataset,
    tiny_model,
    tiny_tokenizer,
    varied_reward,
)

from divrl.integrations import trl as integration  # noqa: E402


def main(out: Path) -> integration.DivRLGRPOTrainer:
    first: list[list[int]] = []
    next_batch = integration.ReferenceStream.next_batch

    def recording(self, *args, **kwargs):
        batch = next_batch(self, *args, **kwargs)
        if not first:
            first.append(batch.input_ids.tolist())
        return batch

    integration.ReferenceStream.next_batch = recording
    if os.environ.get("RANK") == os.environ.get("DIVRL_TEST_FAIL_RANK"):
        integration.PROXY_CONSISTENCY_TOL = -1.0  # this rank's Lp-Reg consistency check fails
    args = make_args(
        out,
        max_steps=2,
        per_device_train_batch_size=4,
        divergence="js",
        reference_store=os.environ["DIVRL_TEST_STORE"],
        reference_batch_size=1,
        lp_reg=True,
        loss_options={"rho": 0.5},
        ddp_backend="gloo",
    )
    model = tiny_model(0)
    initial = float(sum(p.detach().double().sum() for p in model.parameters()))
    trainer = integration.DivRLGRPOTrainer(
        model=model,
        reward_funcs=varied_reward,
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tiny_tokenizer(),
    )
    try:
        trainer.train()
    except Exception as exc:  # recorded per rank, then raised (the process fails)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{os.environ['RANK']}.error").write_text(f"{type(exc).__name__}: {exc}")
        raise
    acc = trainer.accelerator
    wrapper = weakref.ref(trainer.model_wrapped)
    result = {
        "world": acc.num_processes,
        "wrapped_in_ddp": isinstance(wrapper(), DistributedDataParallel),
        "initial_param_sum": initial,
        "param_sum": float(sum(p.detach().double().sum() for p in trainer.model.parameters())),
        "first_reference": first[0] if first else None,
        "log_history": trainer.state.log_history,
    }
    rank = acc.process_index
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    # No trainer.end() here: the trainer ends the run itself at exit, dropping the DDP
    # wrapper before the process group (else a rank can hang at exit); recorded below.
    real_end = integration.DivRLGRPOTrainer.end

    def recording_end(self) -> None:
        real_end(self)
        ended = {"ddp_alive_after_end": wrapper() is not None}
        ended["group_alive"] = torch.distributed.is_initialized()
        (out / f"rank{rank}.end.json").write_text(json.dumps(ended))

    integration.DivRLGRPOTrainer.end = recording_end
    return trainer


if __name__ == "__main__":
    trainer = main(Path(sys.argv[1]))  # alive until exit, as in a plain training script
