"""Run by tests/training/test_distributed.py under ``torchrun``: train, then save each rank's
weights and rank 0's metric history next to the run, then end as `divrl train` does: the
trainer (and its DDP wrapper) first, the process group after."""

import gc
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from train_helpers import sevens_reward

from divrl.distributed import live_ddp_wrappers, release_process_group
from divrl.training.config import load_config
from divrl.training.trainer import Trainer


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    trainer = Trainer(load_config(None, sys.argv[2:]), reward_fn=sevens_reward)
    history = trainer.train()
    state = trainer.accelerator.unwrap_model(trainer.model).state_dict()
    torch.save(state, out / f"rank{trainer.rank}.pt")
    if trainer.accelerator.is_main_process:
        (out / "history.json").write_text(json.dumps(history))
        (out / "world.json").write_text(json.dumps({"world": trainer.world}))
    rank, wrapped = trainer.rank, len(live_ddp_wrappers())
    del trainer
    gc.collect()
    ends = {"ddp_wrappers_in_training": wrapped, "ddp_wrappers_left": len(live_ddp_wrappers())}
    (out / f"end{rank}.json").write_text(json.dumps(ends))
    release_process_group()


if __name__ == "__main__":
    main()
