"""Generate the custom-operator task as verl rows for the ``math_expression`` loop.

python -m recipes.langgraph_agent.data --out data/langgraph_math --train 256 --val 32 --sft 512

Each row is an expression over ``@`` (``a @ b = 3a - 2b``, known only to the ``custom_op``
tool) with one to three operators, e.g. ``(4 @ 7) @ 2``; ground truth is its value.
``--sft N`` also writes solved conversations (``sft.jsonl``) for a warm start.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from recipes.langgraph_agent.tools import apply_op

__all__ = ["SYSTEM", "make_expression", "make_rows", "main"]

DATA_SOURCE = "langgraph_math"
SYSTEM = (
    "The operator @ is a custom operator on integers that only the custom_op tool can "
    "compute: custom_op(a, b) returns a @ b. Evaluate the expression one @ at a time, "
    "innermost first, calling custom_op for each. Then give the final value as "
    "<answer>N</answer>."
)


def make_expression(rng: random.Random, ops: int) -> tuple[str, int, list[tuple[int, int, int]]]:
    """An expression with ``ops`` operators (parenthesised left or right), its value, and
    the ``(a, b, a @ b)`` steps that solve it innermost first."""
    text, value = str(n := rng.randint(1, 9)), n
    steps = []
    for _ in range(ops):
        m = rng.randint(1, 9)
        inner = f"({text})" if "@" in text else text
        if rng.random() < 0.5:  # the expression so far on the left
            a, b, text = value, m, f"{inner} @ {m}"
        else:
            a, b, text = m, value, f"{m} @ {inner}"
        value = apply_op(a, b)
        steps.append((a, b, value))
    return text, value, steps


def make_rows(n: int, seed: int, split: str, max_ops: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ops = rng.randint(1, max_ops)
        expression, value, _ = make_expression(rng, ops)
        rows.append(
            {
                "prompt": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"Compute {expression}."},
                ],
                "data_source": DATA_SOURCE,
                "agent_name": "math_expression",
                "reward_model": {"style": "rule", "ground_truth": str(value)},
                "extra_info": {"split": split, "index": i, "expression": expression, "ops": ops},
            }
        )
    return rows


def make_sft_rows(n: int, seed: int, max_ops: int = 3) -> list[dict[str, Any]]:
    """Solved conversations for the SFT warm start (``agentloop-sft``): one ``custom_op`` call
    per operator, innermost first, then the answer; ``tools`` as the loop binds them."""
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from recipes.langgraph_agent.tools import custom_op

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        expression, value, steps = make_expression(rng, rng.randint(1, max_ops))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Compute {expression}."},
        ]
        for a, b, result in steps:
            call = {"name": "custom_op", "arguments": {"a": a, "b": b}}
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"type": "function", "function": call}],
                }
            )
            messages.append({"role": "tool", "content": str(result)})
        messages.append({"role": "assistant", "content": f"<answer>{value}</answer>"})
        rows.append({"messages": messages, "tools": [convert_to_openai_tool(custom_op)]})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--train", type=int, default=256)
    parser.add_argument("--val", type=int, default=32)
    parser.add_argument("--sft", type=int, default=0, help="also write N SFT conversations")
    parser.add_argument("--max-ops", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.max_ops < 1:
        parser.error("--max-ops must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "train.jsonl", make_rows(args.train, args.seed, "train", args.max_ops))
    write_jsonl(args.out / "val.jsonl", make_rows(args.val, args.seed + 1, "val", args.max_ops))
    if args.sft:
        write_jsonl(args.out / "sft.jsonl", make_sft_rows(args.sft, args.seed + 2, args.max_ops))
    print(f"wrote {args.train} train, {args.val} val, {args.sft} sft rows to {args.out}")


if __name__ == "__main__":
    main()
