#!/usr/bin/env bash
# DPH-alpha on BIRD in upstream verl: alpha.sh's values (docs/fidelity.md, "DPH-alpha").
# Not run by the project (8 GPUs); see docs/verl.md.
set -euo pipefail
source "$(dirname "$0")/dph_bird_common.sh"
python -m verl.trainer.main_ppo "${DPH_BIRD_ARGS[@]}" \
  actor_rollout_ref.actor.use_dynamic_bsz=True \
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32384 \
  +divrl.divergence=alpha \
  +divrl.divergence_alpha=0.2 \
  +divrl.divergence_coef=0.01 \
  +divrl.authors_dynamic_batch=True \
  "$@"
