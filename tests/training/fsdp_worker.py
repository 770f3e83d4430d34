"""Run by tests/training/test_fsdp.py under ``torchrun --nproc_per_node 2``: shard the tiny
tied Llama with FSDP2 (gradient checkpointing on), train it 3 AdamW steps on this rank's
half of a fixed batch, then write what the test compares with a single process:

- ``trained.pt``: ``dict(iter_full_parameters(model))`` (rank 0);
- ``full_state.pt``: ``get_model_state_dict(full_state_dict=True)`` and the full optimiser
  state (rank 0);
- ``generate_rank{r}.json``: greedy tokens under ``full_parameters`` (a different length on
  each rank: generation must run without collectives) and under ``gathered_copy``;
- ``run/checkpoints/step_000003``: a sharded DCP checkpoint (model, optimiser, tokenizer);
- ``checks_rank{r}.json``: facts about the sharded model (tied weights, shard shapes).
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_helpers import LR, PROMPT, STEPS, train_batches

from divrl.training.fsdp import (
    FSDPConfig,
    apply_fsdp,
    full_parameters,
    gathered_copy,
    iter_full_parameters,
)
from divrl.training.fsdp_checkpoint import save_sharded_checkpoint


def main() -> None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out, model_dir = Path(sys.argv[1]), sys.argv[2]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    apply_fsdp(model, FSDPConfig(strategy="fsdp"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model.train()
    for batch in train_batches(STEPS):
        rows = batch.chunk(world)[rank]  # equal halves: the mean of means is the mean
        model(input_ids=rows, labels=rows).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()

    trained = {name: t.clone() for name, t in iter_full_parameters(model)}
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full_model = get_model_state_dict(model, options=options)
    full_optim = get_optimizer_state_dict(model, optimizer, options=options)
    prompt = torch.tensor([PROMPT])
    new_tokens = 4 + 4 * rank
    with full_parameters(model):
        unsharded = model.generate(
            prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
        )
        unsharded_shape = list(model.lm_head.weight.shape)
    with gathered_copy(model) as copy:
        copied = copy.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    checks = {
        "tied": model.lm_head.weight is model.model.embed_tokens.weight,
        "local_rows": model.lm_head.weight.to_local().shape[0],
        "global_rows": model.lm_head.weight.shape[0],
        "rows_while_unsharded": unsharded_shape[0],
        "resharded_type": type(model.model.layers[0].mlp.up_proj.weight).__name__,
    }
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    save_sharded_checkpoint(
        out / "run" / "checkpoints" / f"step_{STEPS:06d}", model, optimizer, tokenizer=tokenizer
    )
    (out / f"generate_rank{rank}.json").write_text(
        json.dumps({"unsharded": unsharded[0].tolist(), "copy": copied[0].tolist()})
    )
    (out / f"checks_rank{rank}.json").write_text(json.dumps(checks))
    if rank == 0:
        torch.save(trained, out / "trained.pt")
        torch.save({"model": full_model, "optim": full_optim}, out / "full_state.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
