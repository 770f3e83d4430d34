#!/usr/bin/env bash
# divrl inside upstream verl, end to end on ONE GPU of a user's machine (not run by the
# project: its GPU machine cannot fetch verl, vLLM or a model). About 10 minutes: it builds
# an environment, presamples a DPH store with divrl, and runs verl's own trainer
# (python -m verl.trainer.main_ppo, Ray, FSDP2, vLLM) for 2 steps each of GRPO, DPH-JS and
# Lp-Reg through divrl's trainer mode, on divrl's math fixture and a 0.5B instruct model,
# at the settings verl users run: remove-padding (flash-attention's packed forward, which a
# CPU cannot run) and dynamic batch sizes in every run; vLLM's rollout log-probs with
# verl's token-level importance-sampling correction in the GRPO and DPH runs; DPH with the
# `authors` weighting and 6 rehearsal rows a step; Lp-Reg with rho 0.5 so that it selects
# tokens on 16 samples.
#
#   bash benchmarks/gpu_verl.sh          # from the repository root; needs the internet
#
# What it should print, per run (verl's console logger, one line of metrics per step):
#   GRPO    step:1 ... actor/pg_clipfrac:... actor/ppo_kl:... critic/score/mean:...
#           rollout_corr/...  (verl's IS metrics: the weights were computed and applied)
#           training/rollout_probs_diff_max:<small: vLLM vs FSDP log-probs>
#   DPH-JS  step:1 ... actor/dph/divergence:<about 0 at step 1: u = 1>
#           actor/dph/effective_eta:<the authors' eta of this layout (divrl.authors_*)>
#           divrl/rehearsal_rows:6  divrl/rehearsal_padding_rows:0  rollout_corr/...
#   Lp-Reg  step:1 ... actor/lp_reg/num_negative:... actor/lp_reg/num_selected:<above 0>
#           actor/lp_reg/num_regularized:...
#   presample through verl: "divrl presample: N reference samples, ..." (N >= 1), then
#   DPH-JS from that store  step:1 ... actor/dph/u_mean:<1 to about 1e-3>
# then "divrl verl GPU check: 5 runs finished" and the five log files' paths.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu_verl}
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
VENV=${VENV:-$OUT/venv}
mkdir -p "$OUT"
python3 -m venv "$VENV"
PY="$VENV/bin/python"
# verl's vllm extra pins its torch, vLLM and transformers; divrl[verl] pins verl itself
"$VENV/bin/pip" install --quiet -e ".[verl]" "verl[vllm]==0.9.1"
"$PY" - <<'PYEOF'
import torch
assert torch.cuda.is_available(), "benchmarks/gpu_verl.sh needs a CUDA device"
print("device:", torch.cuda.get_device_name(0))
PYEOF
# the math fixture as verl-schema parquet (train and validation alike: a plumbing check)
"$PY" - "$OUT" <<'PYEOF'
import sys
from importlib import resources
from divrl.data.loading import load_examples, write_examples
src = resources.files("divrl.data").joinpath("fixtures", "math.jsonl")
examples = load_examples(src)
write_examples(examples, f"{sys.argv[1]}/train.parquet")
write_examples(examples, f"{sys.argv[1]}/val.parquet")
print(len(examples), "math prompts")
PYEOF
"$VENV/bin/divrl" presample configs/dph_js.yaml --overwrite model.path="$MODEL" \
  data.train_path="$OUT/train.parquet" reference.store="$OUT/store" reference.k=4 \
  reference.threshold=1 reference.keep_presampled=true rollout.max_new_tokens=256
"$PY" -m divrl.integrations.verl.data "$OUT/train.parquet" "$OUT/store" \
  "$OUT/train_exploration.parquet" --overwrite
REWARD_FILE=$("$PY" -c "import divrl.integrations.verl.reward as r; print(r.__file__)")
COMMON=(
  trainer.use_v1=True trainer.v1.trainer_mode=divrl_sync trainer.n_gpus_per_node=1
  trainer.nnodes=1 trainer.total_training_steps=2 trainer.logger=[console]
  trainer.val_before_train=True trainer.test_freq=2 trainer.save_freq=-1
  data.val_files="$OUT/val.parquet" data.train_batch_size=4 data.max_prompt_length=256
  data.max_response_length=256 actor_rollout_ref.model.path="$MODEL"
  actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.actor.ppo_mini_batch_size=4
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 actor_rollout_ref.actor.shuffle=False
  actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.use_dynamic_bsz=True
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096
  actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=4
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
  algorithm.adv_estimator=grpo reward.custom_reward_function.path="$REWARD_FILE"
  reward.custom_reward_function.name=compute_score
)
run() {  # name, then extra overrides
  local name=$1; shift
  timeout 900 "$PY" -m verl.trainer.main_ppo "${COMMON[@]}" "$@" 2>&1 | tee "$OUT/$name.log"
  grep -q "step:2" "$OUT/$name.log" || { echo "$name: no second step in $OUT/$name.log" >&2; exit 1; }
}
# vLLM's own log-probs of each sampled token, and verl's truncated token-level IS weights
IS=(actor_rollout_ref.rollout.calculate_log_probs=True algorithm.rollout_correction.rollout_is=token
  algorithm.rollout_correction.rollout_is_threshold=2.0)
run grpo data.train_files="$OUT/train.parquet" "${IS[@]}"
run dph_js data.train_files="$OUT/train_exploration.parquet" "${IS[@]}" +divrl.divergence=js \
  +divrl.divergence_coef=0.2 +divrl.divergence_weighting=authors +divrl.authors_gpus=1 \
  +divrl.authors_dynamic_batch=true \
  +divrl.reference_store="$OUT/store" +divrl.reference_per_step=6
run lp_reg data.train_files="$OUT/train.parquet" +divrl.policy_loss=lp_reg \
  +divrl.loss_options.rho=0.5 +divrl.loss_options.min_k=1 \
  actor_rollout_ref.actor.clip_ratio_low=1.0 actor_rollout_ref.actor.clip_ratio_high=9.0
# the reference store through verl (trainer.v1.trainer_mode=divrl_presample): vLLM rollouts,
# divrl's verifier, verl's actor forward for the log-probs; k = 1 (rollout.n = k + 1 = 2, so
# that a 0.5B model leaves some near-perfect prompts), then 2 DPH-JS steps from that store.
# It should print "divrl presample: N reference samples, M near-perfect of 12 prompts" with
# N >= 1, and at step 1 of dph_js_verl_store actor/dph/u_mean within about 1e-3 of 1 (the
# stored log-probs are verl's own forward's; divrl presample's, above, are divrl's).
timeout 900 "$PY" -m verl.trainer.main_ppo "${COMMON[@]}" data.train_files="$OUT/train.parquet" \
  trainer.v1.trainer_mode=divrl_presample trainer.total_training_steps=null \
  trainer.total_epochs=1 trainer.val_before_train=False trainer.test_freq=-1 \
  actor_rollout_ref.rollout.n=2 +divrl.reference_store="$OUT/store_verl" \
  2>&1 | tee "$OUT/presample_verl.log"
grep "divrl presample:" "$OUT/presample_verl.log"
"$PY" -m divrl.integrations.verl.data "$OUT/train.parquet" "$OUT/store_verl" \
  "$OUT/train_exploration_verl.parquet" --overwrite
run dph_js_verl_store data.train_files="$OUT/train_exploration_verl.parquet" \
  +divrl.divergence=js +divrl.divergence_coef=0.2 +divrl.divergence_weighting=paper \
  +divrl.reference_store="$OUT/store_verl" +divrl.reference_per_step=4
grep -h -o "actor/dph/u_mean:[^ ]*" "$OUT/dph_js_verl_store.log" | head -1
grep -h -o "actor/dph/[a-z_]*:[^ ]*\|actor/lp_reg/num_[a-z]*:[^ ]*\|divrl/rehearsal_[a-z_]*:[^ ]*\|rollout_corr/rollout_is_mean:[^ ]*\|val-core/[^ ]*pass@[^ ]*" \
  "$OUT"/*.log | sort | uniq | head -40
echo "divrl verl GPU check: 5 runs finished; logs: $OUT/grpo.log $OUT/dph_js.log $OUT/lp_reg.log" \
  "$OUT/presample_verl.log $OUT/dph_js_verl_store.log"
