# Shared by the DPH-RL BIRD recipes: the values of seamoke/DPH-RL@139a9b2
# scripts/llama/{forward_kl,js_kl,alpha}.sh and the verl defaults they inherit, as
# docs/fidelity.md tabulates them, in upstream verl 0.9.1's keys. Sourced, not run.
# Not run by the project: it needs 8 GPUs, vLLM and the BIRD data (docs/verl.md).

: "${MODEL:?MODEL: the initial model (a Hugging Face folder)}"
: "${DATA:?DATA: a folder with train.parquet and dev.parquet from divrl data convert bird}"
: "${STORE:?STORE: the reference store divrl presample wrote for this model and train.parquet}"
NGPUS=${NGPUS:-8}
NNODES=${NNODES:-1}
EPOCHS=${EPOCHS:-5}  # forward_kl.sh:255: 5 epochs of the exploration prompts

REWARD_FILE=$(python -c "import divrl.integrations.verl.reward as r; print(r.__file__)")
# DPH-RL rolls out the exploration prompts only (D_exp, recorded in the store)
python -m divrl.integrations.verl.data "$DATA/train.parquet" "$STORE" \
  "$DATA/train_exploration.parquet" --overwrite

DPH_BIRD_ARGS=(
  trainer.use_v1=True
  trainer.v1.trainer_mode=divrl_sync
  trainer.n_gpus_per_node="$NGPUS"
  trainer.nnodes="$NNODES"
  trainer.total_epochs="$EPOCHS"
  trainer.save_freq=80
  data.train_files="$DATA/train_exploration.parquet"
  data.val_files="$DATA/dev.parquet"
  data.train_batch_size=128
  data.max_prompt_length=16000
  data.max_response_length=4096
  data.filter_overlong_prompts=True
  data.truncation=error
  actor_rollout_ref.model.path="$MODEL"
  actor_rollout_ref.actor.strategy=fsdp2
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.optim.weight_decay=0.01
  actor_rollout_ref.actor.optim.lr_scheduler_type=constant
  actor_rollout_ref.actor.optim.clip_grad=1.0
  actor_rollout_ref.actor.ppo_mini_batch_size=64
  actor_rollout_ref.actor.ppo_epochs=1
  actor_rollout_ref.actor.shuffle=False
  actor_rollout_ref.actor.clip_ratio_low=0.2
  actor_rollout_ref.actor.clip_ratio_high=0.28
  actor_rollout_ref.actor.clip_ratio_c=3.0
  actor_rollout_ref.actor.loss_agg_mode=token-mean
  actor_rollout_ref.actor.use_kl_loss=False
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.n=16
  actor_rollout_ref.rollout.temperature=1.0
  actor_rollout_ref.rollout.top_p=0.9
  algorithm.adv_estimator=divrl_grpo
  algorithm.use_kl_in_reward=False
  reward.custom_reward_function.path="$REWARD_FILE"
  reward.custom_reward_function.name=compute_score
  +divrl.reference_store="$STORE"
  +divrl.reference_per_step=256
  +divrl.divergence_weighting=authors
  +divrl.authors_gpus=8
  +divrl.authors_micro_batch_size=2
)
