"""Template-delta benchmark (``make bench``): the per-turn cost of ``encode_delta`` as the
history grows, the full render (the path before: the whole conversation rendered twice each
turn) vs the suffix render (prompt + last model turn + new messages), same run, same ids.

Workload: the tiny-qwen3 tokenizer and Qwen3 template with a tool, a conversation of model
turns that call the tool and tool results of ~120 tokens, grown to 1k, 4k, 16k and 32k tokens
of history. Each side is warmed up, then timed as the median of repeated calls. Writes
bench_results/encode_delta.json. Target (printed): under 0.5 ms per turn at any length.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agentloop.tokens import encode_delta
from tests.unit.agentloop.scripted import CALC_SCHEMA

REPO = Path(__file__).resolve().parents[2]
LENGTHS = (1_000, 4_000, 16_000, 32_000)
TARGET_MS = 0.5
PROMPT = [
    {"role": "system", "content": "You are a careful calculator agent. Use the tool."},
    {"role": "user", "content": "Add up the numbers the tool gives you, one call at a time."},
]


def grow(tokenizer, tokens: int) -> list[dict]:
    """The prompt and model/tool turns until the rendered history holds ``tokens`` tokens."""
    messages = list(PROMPT)
    turn = 0
    while True:
        call = json.dumps({"name": "calc", "arguments": {"a": turn, "b": turn + 1}})
        messages.append(
            {"role": "assistant", "content": f"Step {turn}.\n<tool_call>\n{call}\n</tool_call>"}
        )
        rendered = tokenizer.apply_chat_template(
            messages, tools=[CALC_SCHEMA], tokenize=True, return_dict=False
        )
        if len(rendered) >= tokens:
            return messages
        result = " ".join(f"value-{turn}-{i}={i * turn}" for i in range(30))
        messages.append({"role": "tool", "content": result})
        turn += 1


def per_turn_ms(tokenizer, history, new, head: int | None, repeats: int) -> float:
    """Median ms of one ``encode_delta`` call after a warm-up."""
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        encode_delta(tokenizer, history, new, tools=[CALC_SCHEMA], head=head)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[1:])


@pytest.mark.slow
def test_bench_encode_delta_per_turn_cost(tiny_qwen3_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    new = [{"role": "tool", "content": "5"}]
    results = []
    lines = ["encode_delta per turn (Qwen3 template, one tool; median ms)"]
    lines.append(f"{'history':>9} {'turns':>6} {'full':>9} {'suffix':>9} {'ratio':>7}")
    for length in LENGTHS:
        history = grow(tokenizer, length)
        kwargs = {"tools": [CALC_SCHEMA]}
        full_ids = encode_delta(tokenizer, history, new, **kwargs)
        suffix_ids = encode_delta(tokenizer, history, new, head=len(PROMPT), **kwargs)
        assert suffix_ids == full_ids
        repeats = 50 if length <= 4_000 else 15
        full = per_turn_ms(tokenizer, history, new, None, repeats)
        suffix = per_turn_ms(tokenizer, history, new, len(PROMPT), 50)
        turns = sum(m["role"] == "assistant" for m in history)
        results.append(
            {"history_tokens": length, "model_turns": turns, "full_ms": full, "suffix_ms": suffix}
        )
        lines.append(f"{length:>9,} {turns:>6} {full:>9.3f} {suffix:>9.3f} {full / suffix:>6.1f}x")
    worst = max(r["suffix_ms"] for r in results)
    verdict = "met" if worst < TARGET_MS else "not met"
    lines.append(f"target: suffix under {TARGET_MS} ms per turn at any length: {verdict}")
    print("\n" + "\n".join(lines))
    out = REPO / "bench_results" / "encode_delta.json"
    out.write_text(json.dumps({"results": results, "target_ms": TARGET_MS}, indent=2) + "\n")
