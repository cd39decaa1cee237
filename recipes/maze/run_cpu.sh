#!/usr/bin/env bash
# The maze on CPU (vLLM CPU engine, 2 FSDP2 gloo ranks, Ray local): generate the mazes, an SFT
# warm start on solved move-tool conversations, then RL with per-step progress rewards (the
# move tool's, as process rewards) and the exit as the outcome. CREDIT picks how turns get
# credit (docs/credit.md): grpo (the outcome only), turn_credit (GRPO + the turn term) or gigpo
# (GiGPO: step groups of turns taken from the same cell, named by the tool). TALK=1 runs the
# maze as a simulated user instead of a tool (the default anchor keys: hashes of its replies).
# SETTLE=0.1 settles the progress at the end (recipes/maze/reward.py: a walk that stops short of
# the exit gets 0.1 x its distance). GIVE_UP=0.1 charges a walk that answers short of the exit
# 0.1 for each move it had left, as if each had hit a wall: with walls costing 0.1 and answers
# nothing, a walk learns to answer early instead (docs/credit.md).
# Runs in the repository root from any directory. Environment:
#   MODEL (smollm2-135m-instruct)  DATA (data/maze)  RUN (checkpoints/maze)
#   CREDIT (gigpo)  TALK (0)  SFT_STEPS (16; 0 skips the warm start)  SFT_LR (1e-4)  SETTLE (0)
#   GIVE_UP (0)
# Extra key=value arguments go to agentloop-train, e.g. trainer.total_training_steps=2.
# Micro-batches hold at most 3072 tokens (two long trajectories), and the actor recomputes its
# activations (gradient checkpointing): without it a rank peaked above 7.5 GB with 8 samples a
# group and the machine (23 GB) killed one; with it, 4.3 GB at most.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."  # the repository root: MODEL, DATA, RUN are from there
source recipes/overrides.sh  # CPU_OVERRIDES: the small-CPU-run keys every CPU script sets
MODEL=${MODEL:-smollm2-135m-instruct}
DATA=${DATA:-data/maze}
RUN=${RUN:-checkpoints/maze}
CREDIT=${CREDIT:-gigpo}
TALK=${TALK:-0}
SFT_STEPS=${SFT_STEPS:-16}
SFT_LR=${SFT_LR:-1e-4}
SETTLE=${SETTLE:-0}
GIVE_UP=${GIVE_UP:-0}
PY=${PY:-.venv/bin/python}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}

[ -f "$DATA/sft.jsonl" ] || $PY -m recipes.maze.data --out "$DATA" --train 256 --val 64 --sft 256

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

case "$CREDIT" in
  grpo) CREDIT_KEYS=(algorithm.adv_estimator=grpo) ;;
  turn_credit) CREDIT_KEYS=(algorithm.adv_estimator=grpo algorithm.turn_credit.coef=1.0) ;;
  gigpo) CREDIT_KEYS=(algorithm.adv_estimator=gigpo algorithm.gamma=0.95) ;;
  *) echo "CREDIT=$CREDIT: use grpo, turn_credit or gigpo" >&2; exit 2 ;;
esac
if [ "$TALK" = 1 ]; then
  ENV_KEYS=(
    data.train_files="$DATA/train_talk.jsonl"
    data.val_files="$DATA/val_talk.jsonl"
    actor_rollout_ref.rollout.multi_turn.interaction_config_path=recipes/maze/interaction_config.yaml
    actor_rollout_ref.rollout.multi_turn.max_user_turns=12
  )
else
  ENV_KEYS=(
    data.train_files="$DATA/train.jsonl"
    data.val_files="$DATA/val.jsonl"
    actor_rollout_ref.rollout.multi_turn.tool_config_path=recipes/maze/tool_config.yaml
    reward_model.process_reward_coef=1.0
  )
  [ "$SETTLE" = 0 ] || ENV_KEYS+=(+custom_reward_function.reward_kwargs.settle="$SETTLE")
  [ "$GIVE_UP" = 0 ] || ENV_KEYS+=(+custom_reward_function.reward_kwargs.give_up="$GIVE_UP")
fi
$PY -m trainer.cli.train \
  "${CPU_OVERRIDES[@]}" \
  "${ENV_KEYS[@]}" \
  "${CREDIT_KEYS[@]}" \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.rollout.response_length=1024 \
  actor_rollout_ref.actor.use_dynamic_bsz=True \
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=3072 \
  actor_rollout_ref.model.enable_gradient_checkpointing=True \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=13 \
  actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent \
  custom_reward_function.path=recipes/maze/reward.py \
  trainer.val_before_train=True \
  trainer.logger='[console,jsonl]' \
  trainer.default_local_dir="$RUN/$CREDIT" \
  "$@"
