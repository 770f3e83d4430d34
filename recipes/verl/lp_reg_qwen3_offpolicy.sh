#!/usr/bin/env bash
# Lp-Reg off-policy, Qwen3 math, in upstream verl: offpolicy.sh's values (docs/fidelity.md,
# "Lp-Reg, off-policy"): 8 optimiser steps of 32 prompts per batch. Not run by the project;
# the proxy here comes from each update's forward, not the old-log-prob pass (docs/verl.md).
set -euo pipefail
source "$(dirname "$0")/lp_reg_qwen3_common.sh"
python -m verl.trainer.main_ppo "${LP_REG_ARGS[@]}" \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 \
  "$@"
