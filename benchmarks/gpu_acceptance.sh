#!/usr/bin/env bash
# GPU acceptance of the rollout engines (docs/scaling.md, "GPU acceptance"): one GPU, under
# 8 minutes, nothing downloaded. The cases and their checks: benchmarks/gpu_acceptance.py.
#
#   bash benchmarks/gpu_acceptance.sh [--only CASE ...]     # from anywhere
#
# On a machine without divrl's small dependencies, prepare wheels/ elsewhere first
# (make gpu-wheels); they are installed from it here, offline. The table at the end says
# PASS/FAIL/SKIP per case (vLLM cases SKIP where vLLM is not installed); exit status 1 if
# any case failed. Results and per-case logs: $OUT (default benchmarks/results/gpu_acceptance).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
if ! "$PY" -c "import math_verify, sqlglot, rich" 2>/dev/null; then
  if compgen -G "wheels/*.whl" >/dev/null; then
    "$PY" -m pip install --quiet --no-index --no-deps wheels/*.whl
  else
    echo "math-verify, sqlglot or rich is missing and wheels/ is empty: run 'make gpu-wheels' on a machine with network and copy wheels/ here" >&2
    exit 2
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # divrl from this checkout, installed or not
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
exec "$PY" -m benchmarks.gpu_acceptance --out "${OUT:-benchmarks/results/gpu_acceptance}" "$@"
