#!/usr/bin/env bash
# Search-R1 at small scale on CPU: tool_agent with a BM25 search tool served over MCP (stdio),
# exact-match reward with format terms. Runs in the repository root from anywhere. Environment:
#   MODEL (smollm2-135m-instruct)  DATA (data/search_r1)  RUN (checkpoints/search_r1)
# DATA is built with the generated world unless it exists (see data.py for your own corpus
# and NQ / HotpotQA files). Extra key=value arguments go to agentloop-train.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."  # the repository root: MODEL, DATA, RUN are from there
source recipes/overrides.sh  # CPU_OVERRIDES: the small-CPU-run keys every CPU script sets
MODEL=${MODEL:-smollm2-135m-instruct}
DATA=${DATA:-data/search_r1}
RUN=${RUN:-checkpoints/search_r1}
PY=${PY:-.venv/bin/python}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}

[ -f "$DATA/mcp_search.json" ] || $PY -m recipes.search_r1.data --out "$DATA" --synthetic

$PY -m trainer.cli.train \
  "${CPU_OVERRIDES[@]}" \
  data.train_files="$DATA/train.jsonl" \
  data.val_files="$DATA/val.jsonl" \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.rollout.response_length=384 \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4 \
  actor_rollout_ref.rollout.multi_turn.max_tool_response_length=512 \
  actor_rollout_ref.rollout.multi_turn.tool_config_path="$DATA/mcp_search.json" \
  actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  custom_reward_function.path=recipes/search_r1/reward.py \
  trainer.logger='[console,jsonl]' \
  trainer.default_local_dir="$RUN" \
  "$@"
