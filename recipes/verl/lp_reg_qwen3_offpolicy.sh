#!/usr/bin/env bash
# Lp-Reg off-policy, Qwen3 math, in upstream verl: offpolicy.sh's values (docs/fidelity.md,
# "Lp-Reg, off-policy"): 8 optimiser steps of 32 prompts per batch, the proxy pi_old's from
# verl's old-log-prob pass as in the authors' code. Not run by the project (docs/verl.md).
set -euo pipefail
source "$(dirname "$0")/lp_reg_qwen3_common.sh"
python -m verl.trainer.main_ppo "${LP_REG_ARGS[@]}" \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 \
  "$@"
