#!/usr/bin/env bash
# The repo_fix task family on CPU (vLLM CPU engine, 2 FSDP2 gloo ranks, Ray local): generate
# the tasks, multi-turn SFT warm start on the solved read_file/str_replace/run_check
# conversations, then GRPO with tool_agent and the workspace tools, each sample in a fresh
# sandboxed copy of its package and rewarded by its pytest check (1 when every test
# passes, else 0). Runs in the repository root from any directory. Environment:
#   MODEL (smollm2-135m-instruct)  DATA (data/repo_fix)  RUN (checkpoints/repo_fix)
#   SFT_STEPS (16; 0 skips the warm start and trains MODEL directly)  SFT_LR (1e-4)
#   SFT_MICRO (2: conversations per forward; each SFT rank holds ~9 GB at 2, 1 halves it)
#   PROMPT_LEN (1024)  TOOL_LEN (2048: characters of a tool answer the model sees)
#   LOOPS (unset; recipes/repo_fix/harness_loops.yaml adds the claude_code and codex harness
#   loops, for rows made with make_tasks --agent claude_code | codex)
# Extra key=value arguments go to agentloop-train, e.g. trainer.total_training_steps=2.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."  # the repository root: MODEL, DATA, RUN are from there
source recipes/overrides.sh  # CPU_OVERRIDES: the small-CPU-run keys every CPU script sets
MODEL=${MODEL:-smollm2-135m-instruct}
DATA=${DATA:-data/repo_fix}
RUN=${RUN:-checkpoints/repo_fix}
SFT_STEPS=${SFT_STEPS:-16}
SFT_LR=${SFT_LR:-1e-4}
SFT_MICRO=${SFT_MICRO:-2}
PROMPT_LEN=${PROMPT_LEN:-1024}
TOOL_LEN=${TOOL_LEN:-2048}
LOOPS=${LOOPS:-}
PY=${PY:-.venv/bin/python}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}

[ -f "$DATA/sft.jsonl" ] || $PY -m recipes.repo_fix.make_tasks --out "$DATA" --train 256 --val 64

if [ "$SFT_STEPS" -gt 0 ]; then
  MODEL=$($PY -m trainer.cli.sft \
    data.train_files="$DATA/sft.jsonl" \
    data.train_batch_size=16 \
    data.micro_batch_size_per_gpu="$SFT_MICRO" \
    model.path="$MODEL" \
    optim.lr="$SFT_LR" \
    trainer.n_gpus_per_node=2 \
    trainer.total_training_steps="$SFT_STEPS" \
    trainer.default_local_dir="$RUN/sft" | tail -n 1)
  echo "SFT warm start: $MODEL"
fi

# The prompt (system, problem and the five tool schemas) is 800-900 tokens: CPU_OVERRIDES'
# data.max_prompt_length=512 is raised in place, so the key is still given once. A coding
# CLI's first prompt is larger (Claude Code ~12k tokens, Codex ~8.5k): PROMPT_LEN=16384 with a
# MODEL whose window holds it (tiny-qwen3-long).
# The loop keeps multi_turn.max_tool_response_length characters of a tool answer (256 by
# default): a read_file of a module (550-1,100 characters) would lose its middle, the buggy
# function with it, while the SFT conversations show the whole file. TOOL_LEN keeps it whole.
HARNESS_LOOPS=()
[ -n "$LOOPS" ] && HARNESS_LOOPS=(actor_rollout_ref.rollout.agent.agent_loop_config_path="$LOOPS")
$PY -m trainer.cli.train \
  "${CPU_OVERRIDES[@]/#data.max_prompt_length=*/data.max_prompt_length=$PROMPT_LEN}" \
  data.train_files="$DATA/train.jsonl" \
  data.val_files="$DATA/val.jsonl" \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.rollout.response_length=1024 \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=6 \
  actor_rollout_ref.rollout.multi_turn.max_tool_response_length="$TOOL_LEN" \
  actor_rollout_ref.rollout.multi_turn.tool_config_path=recipes/repo_fix/tool_config.yaml \
  actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent \
  "${HARNESS_LOOPS[@]}" \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  trainer.val_before_train=True \
  trainer.logger='[console,jsonl]' \
  trainer.default_local_dir="$RUN/grpo" \
  "$@"
