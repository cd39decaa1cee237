#!/usr/bin/env bash
# Search-R1 on one 8-GPU node (vLLM servers colocated with the FSDP2 actor): a Qwen model,
# the BM25 MCP search server over your corpus, NQ / HotpotQA rows. Build the data first:
#   python -m recipes.search_r1.data --out data/search_r1_nq --corpus wiki.jsonl \
#     --train_file nq_hotpotqa_train.jsonl --val_file nq_hotpotqa_dev.jsonl
#   MODEL=/models/Qwen2.5-3B-Instruct DATA=data/search_r1_nq bash recipes/search_r1/run_8gpu.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."  # the repository root: MODEL, DATA, RUN are from there
source recipes/overrides.sh  # GPU_NODE_OVERRIDES: the keys of one 8-GPU node
MODEL=${MODEL:?set MODEL to a local model folder}
DATA=${DATA:?set DATA to the folder written by recipes.search_r1.data}
RUN=${RUN:-checkpoints/search_r1_8gpu}
PY=${PY:-python}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}

$PY -m trainer.cli.train \
  "${GPU_NODE_OVERRIDES[@]}" \
  data.train_files="$DATA/train.jsonl" \
  data.val_files="$DATA/val.jsonl" \
  data.train_batch_size=512 \
  data.max_prompt_length=4096 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.rollout.n=5 \
  actor_rollout_ref.rollout.response_length=2048 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5 \
  actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2 \
  actor_rollout_ref.rollout.multi_turn.max_tool_response_length=1024 \
  actor_rollout_ref.rollout.multi_turn.tool_config_path="$DATA/mcp_search.json" \
  actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent \
  actor_rollout_ref.actor.ppo_mini_batch_size=256 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.use_kl_loss=True \
  custom_reward_function.path=recipes/search_r1/reward.py \
  trainer.total_training_steps=1000 \
  trainer.save_freq=50 \
  trainer.test_freq=50 \
  trainer.logger='[console,mlflow]' \
  trainer.default_local_dir="$RUN" \
  "$@"
