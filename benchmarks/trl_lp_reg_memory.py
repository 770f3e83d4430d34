"""Peak memory of TRL's log-prob pass with the TRL adapter's Lp-Reg proxy vs without (CPU).

    OMP_NUM_THREADS=1 python -m benchmarks.trl_lp_reg_memory                  # fp32, 4,096
    OMP_NUM_THREADS=1 python -m benchmarks.trl_lp_reg_memory --dtype bf16
    OMP_NUM_THREADS=1 python -m benchmarks.trl_lp_reg_memory --response 1024 \\
        --variants trl,proxy,unchunked

The pass is TRL 1.16's ``GRPOTrainer._get_per_token_logps_and_entropies`` as TRL calls it
for the old log-probs (no grad, ``batch_size=per_device_train_batch_size``): the backbone,
then TRL's fused LM head (``fused_lm_head=True``: tiles of 4,096 positions x 32,768
vocabulary entries, never the whole logits). The model is a Qwen2 built here (vocabulary
``--vocab``, 2 layers, hidden 256), so the LM head's work dominates as it does at Qwen's
151,936 vocabulary. Variants, each in a fresh process:

- ``trl``: TRL's ``GRPOTrainer``, its own method;
- ``proxy``: ``DivRLGRPOTrainer`` with ``lp_reg=True`` running the same method with the
  capture the adapter sets around TRL's old-log-prob forward (``_generate_and_score_completions``):
  the hook on the backbone projects the hidden states through the LM head, ``chunk``
  positions at a time (:func:`divrl.integrations.trl_lp_reg.proxy_from_hidden`), before
  TRL's head runs;
- ``unchunked``: ``proxy`` with the projection forced into one chunk (what the chunking saves).

The figure is the peak RSS during the pass (``ru_maxrss``) minus the RSS just before it
(model, trainer and batch built, and a short pass already run so that every kernel's code
is loaded). ``peak before`` is the process's own peak before the pass, minus the same
RSS: while it stays below the pass's figure, the pass's peak is the process's peak.
"""

from __future__ import annotations

import tempfile

from benchmarks.common import entry_point, pass_memory_case, pass_memory_parser, run_pass_memory

VARIANTS = ("trl", "proxy", "unchunked")


def _tokenizer():
    """A character tokenizer: TRL needs one to build the trainer; the pass never uses it."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate("0123456789+=")}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )


def _model(vocab: int, dtype):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return Qwen2ForCausalLM(cfg).to(dtype)


def _trainer(args: dict, out_dir: str):
    import torch
    import trl
    from datasets import Dataset

    from divrl.integrations.trl import DivRLGRPOConfig, DivRLGRPOTrainer

    bf16 = args["dtype"] == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    proxy = args["variant"] != "trl"
    config = dict(
        output_dir=out_dir,
        per_device_train_batch_size=args["rows"],
        num_generations=2,  # TRL's least; the pass never generates
        generation_batch_size=2 * args["rows"],
        max_completion_length=args["response"],
        bf16=bf16,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        seed=0,
    )
    if proxy:
        cls, conf = DivRLGRPOTrainer, DivRLGRPOConfig(lp_reg=True, **config)
    else:
        cls, conf = trl.GRPOTrainer, trl.GRPOConfig(**config)
    return cls(
        model=_model(args["vocab"], dtype),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=conf,
        train_dataset=Dataset.from_dict({"prompt": ["1+2="] * args["rows"]}),
        processing_class=_tokenizer(),
    )


def child(args: dict) -> dict:
    """One variant in this process: build, measure RSS, run the pass, read the peak."""
    import functools

    import torch

    import divrl.integrations.trl as adapter
    from benchmarks.common import measured_pass
    from divrl.integrations.trl_lp_reg import HiddenCapture, proxy_chunk_positions

    torch.manual_seed(0)
    variant = args["variant"]
    if variant == "unchunked":
        adapter.proxy_from_hidden = functools.partial(adapter.proxy_from_hidden, chunk=2**31)
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = _trainer(args, out_dir)
    model = trainer.model

    def batch(rows: int, prompt: int, response: int):
        ids = torch.randint(3, args["vocab"], (rows, prompt + response))
        return ids, torch.ones_like(ids)

    def run(ids, mask, response: int):
        """TRL's old-log-prob call, with the capture the adapter sets around it."""
        cap = None
        if variant != "trl":
            cap = HiddenCapture(want_proxy=True, only_model=model)
            trainer._divrl_capture = cap
        try:
            with torch.no_grad():
                logps, _, _ = trainer._get_per_token_logps_and_entropies(
                    model, ids, mask, response, batch_size=trainer.args.per_device_train_batch_size
                )
        finally:
            trainer._divrl_capture = None
        if cap is not None and (cap.error is not None or cap.proxy is None):
            raise RuntimeError(f"the proxy was not captured: {cap.error!r}")
        return logps, cap

    ids, mask = batch(args["rows"], args["prompt"], args["response"])
    (logps, cap), pass_peak, peak_before = measured_pass(
        lambda: run(*batch(1, 4, 8), 8), lambda: run(ids, mask, args["response"])
    )
    positions = ids.shape[0] * (ids.shape[1] - 1)  # TRL's CPU head scores every position
    return {
        "completion_tokens": int(ids.shape[0] * args["response"]),
        "trl_positions": int(positions),
        "chunk": {"trl": None, "unchunked": int(ids.shape[0] * args["response"])}.get(
            variant, proxy_chunk_positions(args["vocab"])
        ),
        "model_gb": sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9,
        "pass_peak_gb": pass_peak,
        "peak_before_pass_gb": peak_before,
        "log_prob_mean": float(logps.float().mean()),
        "proxy_mean": None if cap is None else float(cap.proxy.clamp(min=-1e4).mean()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = pass_memory_parser(
        __doc__.splitlines()[0], rows=1, rows_help="sequences (TRL's batch_size too)",
        prompt=128, response=4096, dtype="fp32", variants="trl,proxy",
    )  # fmt: skip
    args = ap.parse_args(argv)
    columns = {
        "completion tokens": lambda r: r["completion_tokens"],
        "proxy chunk": lambda r: r["chunk"] or "",
        "pass peak (GB)": lambda r: f"{r['pass_peak_gb']:.2f}",
        "peak before (GB)": lambda r: f"{r['peak_before_pass_gb']:.2f}",
    }
    name = f"trl_lp_reg_memory_{args.dtype}_{args.rows}x{args.response}"
    return run_pass_memory(
        "benchmarks.trl_lp_reg_memory", pass_memory_case(args), args.variants, known=VARIANTS,
        baseline="trl", ratio_header="x TRL", columns=columns, name=name, timeout=3600,
    )  # fmt: skip


if __name__ == "__main__":
    entry_point(main, child)
