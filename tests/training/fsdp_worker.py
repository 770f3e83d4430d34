"""Run by tests/training/test_fsdp.py under ``torchrun --nproc_per_node 2``: shard the tiny
tied Llama with FSDP2 (gradient checkpointing on), train it 3 AdamW steps on this rank's
half of a fixed batch, then write what the test compares with a single process:

- ``trained.pt``: ``dict(iter_full_parameters(model))`` (rank 0);
- ``full_state.pt``: ``get_model_state_dict(full_state_dict=True)`` and the full optimiser
  state (rank 0);
- ``generate_rank{r}.json``: greedy tokens under ``full_parameters`` (a different length on
  each rank with ``synced_gpus=False``: generation must run without collectives; with
  ``unshard()`` alone the longer rank fails with "Connection closed by peer") and under
  ``gathered_copy``;
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

from divrl.checkpoint.dcp import save_dcp
from divrl.training.fsdp import (
    FSDPConfig,
    apply_fsdp,
    full_parameters,
    gathered_copy,
    iter_full_parameters,
)


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
    losses = []
    for batch in train_batches(STEPS):
        rows = batch.chunk(world)[rank]  # equal halves: the mean of means is the mean
        loss = model(input_ids=rows, labels=rows).loss
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()
    model.eval()

    trained = {name: t.clone() for name, t in iter_full_parameters(model)}
    bf16_dtypes = sorted(
        {str(t.dtype) for _, t in iter_full_parameters(model, dtype=torch.bfloat16)}
    )
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full_model = get_model_state_dict(model, options=options)
    full_optim = get_optimizer_state_dict(model, optimizer, options=options)
    prompt = torch.tensor([PROMPT])
    new_tokens = 4 + 4 * rank
    with full_parameters(model):
        # synced_gpus=False: transformers would otherwise see an FSDP module and keep every
        # rank stepping (an all-reduce per token) until all are done
        unsharded = model.generate(
            prompt,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            synced_gpus=False,
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
        "first_loss": losses[0],
        "bf16_iter_dtypes": bf16_dtypes,
        **_mixed_precision_offload_step(model_dir, rank, world),
    }
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    save_dcp(
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


def _mixed_precision_offload_step(model_dir: str, rank: int, world: int) -> dict:
    """One step with bf16 compute (MixedPrecisionPolicy) and CPU offload: the settings for a
    GPU, checked here for what a CPU can show (bf16 forward, float32 master weights and
    gradients, the step runs)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = FSDPConfig(strategy="fsdp", param_dtype="bfloat16", fsdp_offload=True)
    apply_fsdp(model, config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    rows = train_batches(1)[0].chunk(world)[rank]
    logits_dtype = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: logits_dtype.append(str(o.dtype)))
    loss = model(input_ids=rows, labels=rows).loss
    loss.backward()
    hook.remove()
    grad_dtype = str(model.lm_head.weight.grad.dtype)
    before = model.model.norm.weight.to_local().clone()
    optimizer.step()
    return {
        "bf16_loss": loss.item(),
        "bf16_logits_dtype": logits_dtype[0],
        "bf16_master_dtype": str(model.lm_head.weight.dtype),
        "bf16_grad_dtype": grad_dtype,
        "bf16_step_moved": not torch.equal(before, model.model.norm.weight.to_local()),
    }


if __name__ == "__main__":
    main()
