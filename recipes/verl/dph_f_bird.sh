#!/usr/bin/env bash
# DPH-F (forward KL) on BIRD in upstream verl: forward_kl.sh's values (docs/fidelity.md,
# "DPH-F"). Not run by the project (8 GPUs); see docs/verl.md for the steps before it.
set -euo pipefail
source "$(dirname "$0")/dph_bird_common.sh"
python -m verl.trainer.main_ppo "${DPH_BIRD_ARGS[@]}" \
  actor_rollout_ref.actor.use_dynamic_bsz=False \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \
  +divrl.divergence=forward_kl \
  +divrl.divergence_coef=0.01 \
  +divrl.authors_dynamic_batch=False \
  "$@"
