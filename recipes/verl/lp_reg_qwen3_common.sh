# Shared by the Lp-Reg Qwen3 math recipes: the values of CarlanLark/Lp-Reg-dev@33b27e2
# recipe/lp_reg/Qwen3_14b_lp_reg_{onpolicy,offpolicy}_64gpu.sh as docs/fidelity.md
# tabulates them, in upstream verl 0.9.1's keys. Sourced, not run.
# Not run by the project: it needs 64 GPUs (8 nodes x 8), vLLM and the math data.

: "${MODEL:?MODEL: Qwen3-14B-Base or the model to train (a Hugging Face folder)}"
: "${DATA:?DATA: a folder with train.parquet and val.parquet (verl schema, data_source math)}"
NGPUS=${NGPUS:-8}
NNODES=${NNODES:-8}

REWARD_FILE=$(python -c "import divrl.integrations.verl.reward as r; print(r.__file__)")

LP_REG_ARGS=(
  trainer.use_v1=True
  trainer.v1.trainer_mode=divrl_sync
  trainer.n_gpus_per_node="$NGPUS"
  trainer.nnodes="$NNODES"
  trainer.total_epochs=15
  trainer.save_freq=64
  data.train_files="$DATA/train.parquet"
  data.val_files="$DATA/val.parquet"
  data.train_batch_size=256
  data.max_prompt_length=2048
  data.max_response_length=8192
  data.truncation=left
  actor_rollout_ref.model.path="$MODEL"
  actor_rollout_ref.actor.strategy=fsdp2
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.optim.weight_decay=0
  actor_rollout_ref.actor.optim.lr_scheduler_type=constant
  actor_rollout_ref.actor.optim.clip_grad=1.0
  actor_rollout_ref.actor.ppo_epochs=1
  actor_rollout_ref.actor.shuffle=False
  actor_rollout_ref.actor.use_dynamic_bsz=True
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30720
  actor_rollout_ref.actor.clip_ratio_low=1.0
  actor_rollout_ref.actor.clip_ratio_high=9.0
  actor_rollout_ref.actor.loss_agg_mode=token-mean
  actor_rollout_ref.actor.use_kl_loss=False
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.n=8
  actor_rollout_ref.rollout.temperature=1.0
  actor_rollout_ref.rollout.top_p=1.0
  actor_rollout_ref.rollout.top_k=-1
  algorithm.adv_estimator=divrl_grpo
  algorithm.use_kl_in_reward=False
  reward.custom_reward_function.path="$REWARD_FILE"
  reward.custom_reward_function.name=compute_score
  +divrl.policy_loss=lp_reg
  +divrl.loss_options.rho=0.01
  +divrl.loss_options.kappa=0.02
  +divrl.loss_options.beta=1.0
  +divrl.loss_options.min_k=2
)
