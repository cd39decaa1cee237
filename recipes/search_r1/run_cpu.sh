#!/usr/bin/env bash
# Search-R1 at small scale on CPU: tool_agent with a BM25 search tool served over MCP (stdio),
# exact-match reward with format terms. Run from the repository root. Environment:
#   MODEL (smollm2-135m-instruct)  DATA (data/search_r1)  RUN (checkpoints/search_r1)
# DATA is built with the generated world unless it exists (see data.py for your own corpus
# and NQ / HotpotQA files). Extra key=value arguments go to agentloop-train.
set -euo pipefail
MODEL=${MODEL:-smollm2-135m-instruct}
DATA=${DATA:-data/search_r1}
RUN=${RUN:-checkpoints/search_r1}
PY=${PY:-.venv/bin/python}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}

[ -f "$DATA/mcp_search.json" ] || $PY -m recipes.search_r1.data --out "$DATA" --synthetic

$PY -m trainer.cli.train \
  data.train_files="$DATA/train.jsonl" \
  data.val_files="$DATA/val.jsonl" \
  data.return_raw_chat=True \
  data.train_batch_size=4 \
  data.max_prompt_length=512 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.response_length=384 \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4 \
  actor_rollout_ref.rollout.multi_turn.max_tool_response_length=512 \
  actor_rollout_ref.rollout.multi_turn.tool_config_path="$DATA/mcp_search.json" \
  actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent \
  actor_rollout_ref.actor.ppo_mini_batch_size=4 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  custom_reward_function.path=recipes/search_r1/reward.py \
  trainer.n_gpus_per_node=2 \
  trainer.total_training_steps=4 \
  trainer.test_freq=2 \
  trainer.logger='[console,jsonl]' \
  trainer.default_local_dir="$RUN" \
  "$@"
