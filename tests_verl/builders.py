"""Batches in the layout verl's actor update receives, built from random numbers."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.engine.utils import prepare_micro_batches

from divrl.data.reference_store import ReferenceSample


def rollout_rows(n: int, seed: int = 0, vocab: int = 50) -> TensorDict:
    """``n`` rollout rows (nested, one per response) with random lengths, old log-probs and
    advantages (one per row, as GRPO's are, some negative)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        p = int(torch.randint(2, 6, (1,), generator=g))
        r = int(torch.randint(2, 9, (1,), generator=g))
        prompt = torch.randint(0, vocab, (p,), generator=g)
        response = torch.randint(0, vocab, (r,), generator=g)
        adv = float(torch.randn(1, generator=g))
        rows.append(
            {
                "prompts": prompt,
                "responses": response,
                "input_ids": torch.cat([prompt, response]),
                "attention_mask": torch.ones(p + r, dtype=torch.int64),
                "position_ids": torch.arange(p + r),
                "response_mask": torch.ones(r, dtype=torch.int64),
                "loss_mask": torch.ones(r, dtype=torch.int64),
                "old_log_probs": -torch.rand(r, generator=g) * 3,
                "advantages": torch.full((r,), adv),
            }
        )
    return tu.list_of_dict_to_tensordict(rows)


def reference_samples(n: int, seed: int = 1, vocab: int = 50) -> list[ReferenceSample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = int(torch.randint(2, 6, (1,), generator=g))
        r = int(torch.randint(2, 9, (1,), generator=g))
        out.append(
            ReferenceSample(
                prompt_id=f"q{i}",
                prompt_ids=torch.randint(0, vocab, (p,), generator=g).tolist(),
                response_ids=torch.randint(0, vocab, (r,), generator=g).tolist(),
                ref_log_probs=(-torch.rand(r, generator=g) * 3).tolist(),
            )
        )
    return out


def sequence_log_probs(batch: TensorDict, seed: int = 2) -> torch.Tensor:
    """Random per-token log-probs of every row's whole sequence (nested, as the engine's
    ``log_probs`` output), requiring grad."""
    g = torch.Generator().manual_seed(seed)
    ids = batch["input_ids"]
    values = (-torch.rand(ids.values().shape[0], generator=g) * 3).requires_grad_()
    return values, torch.nested.nested_tensor_from_jagged(values, ids.offsets())


def micro_batches(batch: TensorDict, micro_batch_size: int, dp_size: int = 1) -> list[TensorDict]:
    """verl's own micro-batching of one rank's mini-batch, after the engine's bookkeeping
    (global token count, data-parallel size)."""
    tu.assign_non_tensor(
        batch,
        batch_num_tokens=int(batch["loss_mask"].values().sum()),
        dp_size=dp_size,
        global_batch_size=len(batch),
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=micro_batch_size,
    )
    micro, _ = prepare_micro_batches(batch, dp_group=None)
    return micro
