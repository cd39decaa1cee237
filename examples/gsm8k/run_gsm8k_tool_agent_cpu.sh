#!/usr/bin/env bash
# GRPO on GSM8K with tool_agent and the calculator tool, on CPU, with rollout traces in MLflow
# (the familiar GSM8K tool-agent MLflow example). Runs in the repository root (from any directory), after
#   python examples/data_preprocess/gsm8k_tool_agent_loop.py --train_file ... --test_file ... \
#     --out_dir data/gsm8k_tool
# Environment: MODEL (smollm2-135m-instruct), DATA (data/gsm8k_tool), RUN (checkpoints/gsm8k_tool).
# Extra key=value arguments override, e.g. trainer.total_training_steps=2.
# Traces: `.venv/bin/agentloop-traces --run-dir $RUN` (or `make traces`) opens the MLflow UI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."  # the repository root: MODEL, DATA, RUN are from there
source recipes/overrides.sh  # CPU_OVERRIDES: the small-CPU-run keys every CPU script sets
MODEL=${MODEL:-smollm2-135m-instruct}
DATA=${DATA:-data/gsm8k_tool}
RUN=${RUN:-checkpoints/gsm8k_tool}
PY=${PY:-.venv/bin/python}

$PY -m trainer.cli.train \
  "${CPU_OVERRIDES[@]}" \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.rollout.response_length=512 \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5 \
  actor_rollout_ref.rollout.multi_turn.tool_config_path=examples/gsm8k/tool_config.yaml \
  actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent \
  actor_rollout_ref.rollout.trace.backend=mlflow \
  actor_rollout_ref.rollout.trace.token2text=True \
  actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=4 \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  trainer.logger='[console,mlflow]' \
  trainer.project_name=gsm8k_tool_agent \
  trainer.default_local_dir="$RUN" \
  "$@"
