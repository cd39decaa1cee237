# Overrides the run scripts share, as bash arrays; a script sources this file from the
# repository root and puts one array first in its command, its own key=value lines after:
#   source recipes/overrides.sh
#   $PY -m trainer.cli.train "${CPU_OVERRIDES[@]}" data.train_files=... "$@"
# A key given twice takes the last value, so a script sets none of these keys again (the caller's
# "$@" comes last and may). tests/unit/recipes/test_run_scripts.py checks each script's list.

# Small GRPO runs on a CPU: agent loops over raw chats, 2 FSDP2 gloo ranks, 4 prompts x 4
# samples a step, 4 steps with validation every 2.
CPU_OVERRIDES=(
  data.return_raw_chat=True
  data.train_batch_size=4
  data.max_prompt_length=512
  actor_rollout_ref.rollout.mode=async
  actor_rollout_ref.rollout.n=4
  actor_rollout_ref.actor.ppo_mini_batch_size=4
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
  trainer.n_gpus_per_node=2
  trainer.total_training_steps=4
  trainer.test_freq=2
)

# One node of 8 GPUs: agent loops over raw chats, vLLM servers colocated with the FSDP2 actor,
# one server and one agent-loop worker per GPU, gradient checkpointing.
GPU_NODE_OVERRIDES=(
  data.return_raw_chat=True
  actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.rollout.mode=async
  actor_rollout_ref.rollout.num_servers=8
  actor_rollout_ref.rollout.agent.num_workers=8
  trainer.device=cuda
  trainer.n_gpus_per_node=8
)
