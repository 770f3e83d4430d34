#!/usr/bin/env bash
# Lp-Reg on-policy, Qwen3 math, in upstream verl: onpolicy.sh's values (docs/fidelity.md,
# "Lp-Reg, on-policy"): one optimiser step per batch of 256 prompts. Not run by the project.
set -euo pipefail
source "$(dirname "$0")/lp_reg_qwen3_common.sh"
python -m verl.trainer.main_ppo "${LP_REG_ARGS[@]}" \
  actor_rollout_ref.actor.ppo_mini_batch_size=256 \
  "$@"
