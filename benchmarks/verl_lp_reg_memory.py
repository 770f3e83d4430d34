"""Peak memory of verl's old-log-prob pass with divrl's Lp-Reg hook vs without (CPU).

Run in the verl extra's environment (``make test-verl`` builds it):

    OMP_NUM_THREADS=1 .venv-verl/bin/python -m benchmarks.verl_lp_reg_memory

The pass is what verl's FSDP engine does for ``compute_log_prob`` with remove-padding: a
no-grad forward of the packed micro-batch (a 1-layer Llama with hidden size 64, so the
``[tokens, vocab]`` logits dominate, as they do at 151,936 vocabularies), then
``FSDPEngineWithLMHead.prepare_model_outputs``: entropy and log-probs from the logits, and
with Lp-Reg the engine's logits-processor call into :class:`DivRLLoss` (the proxy). Each
case runs in a fresh process; its figure is the peak RSS during the pass minus the RSS
just before it (the model and the batch). ``unchunked`` is the hook forced to one chunk
(the proxy's fp32 work over all rows at once): the memory the chunking saves.
"""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks.common import entry_point, pass_memory_case, pass_memory_parser, run_pass_memory

VARIANTS = ("none", "hook", "unchunked")


def _engine(entropy_chunking: bool):
    """verl's FSDP engine with what ``prepare_model_outputs`` reads (no model, no FSDP)."""
    import verl.utils.torch_functional as verl_F
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    engine = object.__new__(FSDPEngineWithLMHead)
    engine.use_ulysses_sp = False
    engine.engine_config = SimpleNamespace(
        entropy_checkpointing=False,
        entropy_from_logits_with_chunking=entropy_chunking,
        entropy_from_logits_chunk_size=2048,
    )
    engine.compute_entropy_from_logits = (
        verl_F.entropy_from_logits_with_chunking if entropy_chunking else verl_F.entropy_from_logits
    )
    return engine


def child(args: dict) -> dict:
    """One case in this process: build, measure RSS, run the pass, read the peak."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from benchmarks.common import measured_pass
    from benchmarks.verl_overhead import actor_config, packed_rows
    from divrl.integrations.verl import lp_reg_proxy
    from divrl.integrations.verl.losses import DivRLLoss
    from divrl.integrations.verl.settings import DivRLVerlSettings

    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args["dtype"]]
    cfg = LlamaConfig(
        vocab_size=args["vocab"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    variant = args["variant"]
    if variant == "unchunked":
        lp_reg_proxy.auto_chunk_rows = lambda rows, element_size: rows
    engine = _engine(args["entropy_chunking"])
    loss_fn = DivRLLoss(actor_config(), DivRLVerlSettings(policy_loss="lp_reg"))

    def batch(rows: int, seed: int):
        micro = packed_rows(rows, args["prompt"], args["response"], args["vocab"], seed=seed)
        tu.assign_non_tensor(
            micro,
            use_remove_padding=True,
            distillation_use_topk=variant != "none",
            calculate_entropy=True,
            temperature=1.0,
            sp_size=1,
        )
        return micro

    def run(micro):
        """The pass: the packed forward, then the engine's outputs from its logits."""
        ids = micro["input_ids"]
        nnz = int(ids.values().shape[0])
        positions = torch.cat([torch.arange(n) for n in ids.offsets().diff().tolist()])
        output_args = {
            "input_ids_rmpad_rolled": torch.roll(ids.values(), -1),
            "temperature_rmpad": torch.ones(nnz),
            "pad_size": 0,
            "temperature_is_one": True,
        }
        with torch.no_grad():
            logits = model(input_ids=ids.values()[None], position_ids=positions[None]).logits
            out = FSDPEngineWithLMHead.prepare_model_outputs(
                engine, SimpleNamespace(logits=logits), output_args, micro, loss_fn
            )
        return nnz, logits.numel() * logits.element_size(), out

    micro = batch(args["rows"], seed=1)
    (nnz, logits_bytes, out), pass_peak, peak_before = measured_pass(
        lambda: run(batch(2, seed=2)), lambda: run(micro)
    )
    return {
        "tokens": nnz,
        "logits_gb": logits_bytes / 1e9,
        "pass_peak_gb": pass_peak,
        "peak_before_pass_gb": peak_before,
        "proxy": sorted(k for k in out if k.startswith("divrl")),
    }


def main(argv: list[str] | None = None) -> int:
    ap = pass_memory_parser(
        __doc__.splitlines()[0], rows=16, rows_help="sequences in the micro-batch", prompt=64,
        response=200, dtype="bf16", variants=",".join(VARIANTS),
    )  # fmt: skip
    ap.add_argument(
        "--entropy-chunking",
        choices=("on", "off"),
        default="on",
        help="verl's engine.entropy_from_logits_with_chunking (off: verl's default)",
    )
    args = ap.parse_args(argv)
    case = pass_memory_case(args, entropy_chunking=args.entropy_chunking == "on")
    columns = {
        "tokens": lambda r: r["tokens"],
        "logits (GB)": lambda r: f"{r['logits_gb']:.2f}",
        "pass peak (GB)": lambda r: f"{r['pass_peak_gb']:.2f}",
    }
    name = f"verl_lp_reg_memory_{args.dtype}_entropy_{args.entropy_chunking}"
    return run_pass_memory(
        "benchmarks.verl_lp_reg_memory", case, args.variants, known=VARIANTS, baseline="none",
        ratio_header="x no hook", columns=columns, name=name,
    )  # fmt: skip


if __name__ == "__main__":
    entry_point(main, child)
