"""Run by tests/rollout/test_static_engine.py under ``torchrun --nproc_per_node 2``: shard the
shipped toy model with FSDP2, then sample every second prompt (this rank's share, with its
seed) through the static engine under ``full_parameters``, and write
``<name>_rank{r}.json`` (response ids, log-probs) for greedy and sampled settings."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from divrl.rollout import SamplingParams
from divrl.rollout.static import StaticCacheEngine
from divrl.training.fsdp import FSDPConfig, apply_fsdp, full_parameters

TOY_PROMPTS = [
    f"SQL: {q}\nA: "
    for q in (
        "how many item have pr>=30?",
        "which book has the lowest qt?",
        "names of car not in shop sun?",
        "total pr of song with qt<30?",
        "how many dog have pr<=12?",
    )
]
PARAMS = {
    "greedy": SamplingParams(n=1, temperature=0.0, max_new_tokens=40),
    "sampled": SamplingParams(n=3, temperature=1.0, top_p=0.9, max_new_tokens=40),
}


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out, model_dir = Path(sys.argv[1]), sys.argv[2]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    apply_fsdp(model, FSDPConfig(strategy="fsdp"))
    engine = StaticCacheEngine(model, tok, full_weights=lambda: full_parameters(model))
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in TOY_PROMPTS]
    mine = list(range(rank, len(prompts), world))
    for name, params in PARAMS.items():
        got = engine.generate([prompts[i] for i in mine], params, seeds=mine)
        record = {"response_ids": got.response_ids, "log_probs": got.log_probs}
        (out / f"{name}_rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
