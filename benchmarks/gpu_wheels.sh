#!/usr/bin/env bash
# Wheels of what divrl needs beyond the GPU image, for a machine that cannot download.
#
# The image has Python 3.12 with torch, transformers (and with it tokenizers, safetensors,
# huggingface_hub, PyYAML, tqdm, numpy), accelerate, pyarrow and peft; divrl's remaining
# runtime imports are pure-Python and small: the math and SQL verifiers (math-verify and
# its LaTeX parser, sqlglot), rich (tables), and setuptools/wheel for an offline editable
# install. They are downloaded here, pinned to the versions the CPU tests run with, into
# wheels/ (git-ignored; a few MiB, under the 64 MiB a device run may carry):
#
#   make gpu-wheels                  # or: bash benchmarks/gpu_wheels.sh [DEST]
#
# and installed there, with no network, before benchmarks/gpu_acceptance.sh:
#
#   pip install --no-index --no-deps wheels/*.whl
#   pip install --no-index --find-links wheels --no-deps -e .
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
DEST=${1:-wheels}
mkdir -p "$DEST"
"$PY" -m pip download --quiet --dest "$DEST" --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation py --platform any \
  "math-verify==0.9.0" "latex2sympy2_extended==1.11.0" "antlr4-python3-runtime==4.13.2" \
  "sqlglot==30.31.0" "rich==15.0.0" "markdown-it-py==4.3.0" "mdurl==0.1.2" \
  "pygments==2.21.0" "setuptools==80.9.0" "wheel==0.45.1"
ls -1 "$DEST"
du -sh "$DEST"
