#!/usr/bin/env bash
# The custom-operator task with the LangGraph ReAct loop on CPU (vLLM CPU engine, 2 FSDP2 gloo
# ranks, Ray local): generate data, multi-turn SFT warm start on solved conversations, then
# GRPO with `math_expression` rows. Runs in the repository root from any directory. Environment:
#   MODEL (smollm2-135m-instruct)  DATA (data/langgraph_math)  RUN (checkpoints/langgraph_math)
#   SFT_STEPS (16; 0 skips the warm start and trains MODEL directly)  SFT_LR (1e-4)
# Extra key=value arguments go to agentloop-train, e.g. trainer.total_training_steps=2.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."  # the repository root: MODEL, DATA, RUN are from there
source recipes/overrides.sh  # CPU_OVERRIDES: the small-CPU-run keys every CPU script sets
MODEL=${MODEL:-smollm2-135m-instruct}
DATA=${DATA:-data/langgraph_math}
RUN=${RUN:-checkpoints/langgraph_math}
SFT_STEPS=${SFT_STEPS:-16}
SFT_LR=${SFT_LR:-1e-4}
PY=${PY:-.venv/bin/python}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}

[ -f "$DATA/sft.jsonl" ] || $PY -m recipes.langgraph_agent.data --out "$DATA" --sft 512

if [ "$SFT_STEPS" -gt 0 ]; then
  MODEL=$($PY -m trainer.cli.sft \
    data.train_files="$DATA/sft.jsonl" \
    data.train_batch_size=16 \
    data.micro_batch_size_per_gpu=4 \
    model.path="$MODEL" \
    optim.lr="$SFT_LR" \
    trainer.n_gpus_per_node=2 \
    trainer.total_training_steps="$SFT_STEPS" \
    trainer.default_local_dir="$RUN/sft" | tail -n 1)
  echo "SFT warm start: $MODEL"
fi

$PY -m trainer.cli.train \
  "${CPU_OVERRIDES[@]}" \
  data.train_files="$DATA/train.jsonl" \
  data.val_files="$DATA/val.jsonl" \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.rollout.prompt_length=512 \
  actor_rollout_ref.rollout.response_length=256 \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5 \
  actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=64 \
  actor_rollout_ref.rollout.agent.agent_loop_config_path=recipes/langgraph_agent/agent.yaml \
  actor_rollout_ref.rollout.agent.default_agent_loop=math_expression \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  custom_reward_function.path=recipes/langgraph_agent/reward.py \
  custom_reward_function.name=compute_score \
  trainer.val_before_train=True \
  trainer.logger='[console,jsonl]' \
  trainer.default_local_dir="$RUN/grpo" \
  "$@"
