"""Worker of the FSDP2 Lp-Reg proxy test: `torchrun --nproc_per_node 2 fsdp_proxy_worker.py OUT`.

Computes the adapter's Lp-Reg proxy (the hook on the backbone, each chunk projected
through the LM head as it comes) on a tiny Llama before and after FSDP2 ``fully_shard``
(every decoder layer and the root, gloo, CPU) and writes ``OUT/rank<r>.json`` with both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from trl_helpers import tiny_model  # noqa: E402

from divrl.integrations.trl_lp_reg import hidden_state_hook, lm_head_projection, proxy_from_hidden  # noqa: E402


def proxies(model, ids: torch.Tensor, keep: int) -> list[list[float]]:
    parts: list[torch.Tensor] = []

    def project(hidden: torch.Tensor) -> None:
        with lm_head_projection(model) as head:
            parts.append(proxy_from_hidden(head, hidden, ids[:, -keep:], 0.02, 1.0)[0])

    with torch.no_grad(), hidden_state_hook(model.model, keep, project):
        model(input_ids=ids)
    return torch.cat(parts).tolist()


def main(out: Path) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    model = tiny_model(0)
    ids = torch.randint(3, 16, (3, 10), generator=torch.Generator().manual_seed(rank))
    before = proxies(model, ids, 6)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    sharded = isinstance(model.lm_head.weight, DTensor)
    after = proxies(model, ids, 6)
    out.mkdir(parents=True, exist_ok=True)
    result = {"sharded": sharded, "before": before, "after": after}
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    # both ranks past their last collective before either closes its connections: a rank
    # whose peer closed while gloo still served it was aborted by std::terminate
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
