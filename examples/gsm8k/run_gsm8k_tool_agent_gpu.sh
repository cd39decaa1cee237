#!/usr/bin/env bash
# GRPO on GSM8K with tool_agent and the calculator tool on one 8-GPU node (vLLM servers
# colocated with the FSDP2 actor), rollout traces in MLflow. Install the GPU extra
# (`pip install -e ".[vllm,dev]"` in a CUDA environment), preprocess the data as in the CPU
# script, then run (from any directory; the script runs in the repository root):
#   MODEL=/models/Qwen3-4B bash examples/gsm8k/run_gsm8k_tool_agent_gpu.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."  # the repository root: MODEL, DATA, RUN are from there
source recipes/overrides.sh  # GPU_NODE_OVERRIDES: the keys of one 8-GPU node
MODEL=${MODEL:?set MODEL to a local Qwen3 (or other chat model) folder}
DATA=${DATA:-data/gsm8k_tool}
RUN=${RUN:-checkpoints/gsm8k_tool_gpu}
PY=${PY:-python}

$PY -m trainer.cli.train \
  "${GPU_NODE_OVERRIDES[@]}" \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size=256 \
  data.max_prompt_length=1024 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.response_length=1024 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5 \
  actor_rollout_ref.rollout.multi_turn.tool_config_path=examples/gsm8k/tool_config.yaml \
  actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent \
  actor_rollout_ref.rollout.trace.backend=mlflow \
  actor_rollout_ref.rollout.trace.token2text=True \
  actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=4 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.use_kl_loss=True \
  trainer.total_training_steps=200 \
  trainer.save_freq=20 \
  trainer.test_freq=10 \
  trainer.logger='[console,mlflow]' \
  trainer.project_name=gsm8k_tool_agent \
  trainer.default_local_dir="$RUN" \
  "$@"
