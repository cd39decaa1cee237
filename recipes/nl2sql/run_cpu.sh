#!/usr/bin/env bash
# GRPO on the NL-to-SQL task on CPU: tool_agent with the read-only run_sql tool, reward
# verified by running the final query (recipes/nl2sql/reward.py). Runs in the repository root
# from any directory. Environment: MODEL (smollm2-135m-instruct), DATA (data/nl2sql),
# RUN (checkpoints/nl2sql).
# Extra key=value arguments go to agentloop-train, e.g. trainer.total_training_steps=2.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."  # the repository root: MODEL, DATA, RUN are from there
source recipes/overrides.sh  # CPU_OVERRIDES: the small-CPU-run keys every CPU script sets
MODEL=${MODEL:-smollm2-135m-instruct}
DATA=${DATA:-data/nl2sql}
RUN=${RUN:-checkpoints/nl2sql}
PY=${PY:-.venv/bin/python}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}

[ -f "$DATA/train.jsonl" ] || $PY -m recipes.nl2sql.data --out "$DATA" --train 64 --val 16

$PY -m trainer.cli.train \
  "${CPU_OVERRIDES[@]}" \
  data.train_files="$DATA/train.jsonl" \
  data.val_files="$DATA/val.jsonl" \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.rollout.response_length=256 \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4 \
  actor_rollout_ref.rollout.multi_turn.tool_config_path=recipes/nl2sql/tool_config.yaml \
  actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent \
  reward_model.verify.path=recipes/nl2sql/reward.py \
  reward_model.weights.rule=0 \
  trainer.logger='[console,jsonl]' \
  trainer.default_local_dir="$RUN" \
  "$@"
