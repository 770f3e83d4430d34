#!/usr/bin/env bash
# The divrl benchmarks on a CUDA machine, a few minutes in all: a ~0.5B random-init Llama
# in bf16 for the trainer step times (hf engine, and vLLM where it is installed), the hf
# rollout throughput, the chunked logits pass at vocab 152,064 up to 8k tokens, and the
# trainer under train.strategy=fsdp vs ddp on one GPU.
# Writes every JSON/Markdown result under one folder: $OUT (default benchmarks/results/gpu).
#
#   bash benchmarks/gpu.sh            # from the repository root, with .venv or divrl installed
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
export DIVRL_BENCH_DIR=${OUT:-benchmarks/results/gpu}
mkdir -p "$DIVRL_BENCH_DIR"
"$PY" - <<'PYEOF'
import torch
assert torch.cuda.is_available(), "benchmarks/gpu.sh needs a CUDA device"
print("device:", torch.cuda.get_device_name(0))
PYEOF
# ~0.5B parameters: hidden 1024, 24 layers (vocab of the toy tokenizer keeps the head small)
SIZE=(--hidden 1024 --layers 24 --prompts 16 --n 8 --response-len 256 --micro 32)
"$PY" -m benchmarks.step_time "${SIZE[@]}" --dtype bfloat16 --steps 3 --repeats 1
if "$PY" -c "import vllm" 2>/dev/null; then
  DIVRL_BENCH_DIR="$DIVRL_BENCH_DIR/vllm" "$PY" -m benchmarks.step_time "${SIZE[@]}" \
    --dtype bfloat16 --engine vllm --steps 3 --repeats 1
else
  echo "vllm not installed: skipping the vLLM engine case"
fi
"$PY" -m benchmarks.logits --lengths 1024 4096 8192 --repeats 3 --naive-max-gb 60 --device cuda
"$PY" -m benchmarks.rollout --hidden 1024 --layers 24 --prompts 16 --n 8 --new-tokens 256 \
  --repeats 3 --device cuda --dtype bfloat16
# train.strategy=fsdp vs ddp through the trainer (GRPO, DPH-JS, Lp-Reg), one process on one
# GPU: FSDP2 over a 1-rank mesh, bf16 compute over float32 masters. A sanity check of the
# sharded path (rollouts in full_parameters, NCCL, mixed precision); for the memory saving
# run it on 8 GPUs with --nproc 8 (docs/benchmarks.md).
DIVRL_BENCH_DIR="$DIVRL_BENCH_DIR/fsdp" "$PY" -m benchmarks.fsdp_trainer --nproc 1 \
  --hidden 1024 --layers 24 --prompts 16 --n 8 --response-len 256 --micro 32 \
  --dtype float32 --param-dtype bfloat16 --steps 3
echo "results in $DIVRL_BENCH_DIR"
