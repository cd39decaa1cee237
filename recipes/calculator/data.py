"""The demo's calculator task: multi-digit arithmetic a 135M model gets wrong in its head and
right with the ``calculator`` tool, as ``tool_agent`` rows and as solved SFT conversations.

python -m recipes.calculator.data --out data/calculator --train 256 --val 64 --sft 256
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from agentloop.tools.calculator import CALCULATOR_SCHEMA, evaluate, format_value

__all__ = ["SYSTEM", "make_problem", "make_rows", "make_sft_rows", "main"]

DATA_SOURCE = "calculator"
SYSTEM = "Use the calculator tool for every calculation. Finish with the line '#### <number>'."


def make_problem(rng: random.Random) -> tuple[str, str]:
    """(question, expression) with 3-4 digit operands."""
    a, b, c = rng.randint(100, 999), rng.randint(11, 99), rng.randint(100, 9999)
    expression = rng.choice(
        [f"{a} * {b}", f"{a} * {b} + {c}", f"{a} * {b} - {c}", f"({a} + {c}) * {b}"]
    )
    question = rng.choice(["What is {}?", "Compute {}.", "Calculate {}."]).format(expression)
    return question, expression


def answer_of(expression: str) -> str:
    return format_value(evaluate(expression))


def make_rows(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        question, expression = make_problem(rng)
        truth = answer_of(expression)
        rows.append(
            {
                "prompt": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": question},
                ],
                "data_source": DATA_SOURCE,
                "agent_name": "tool_agent",
                "reward_model": {"style": "rule", "ground_truth": truth},
                "extra_info": {
                    "split": split,
                    "index": i,
                    "expression": expression,
                    "tools_kwargs": {"calculator": {"create_kwargs": {"ground_truth": truth}}},
                },
            }
        )
    return rows


def make_sft_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """Solved conversations: one calculator call with the expression, then the answer line."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question, expression = make_problem(rng)
        truth = answer_of(expression)
        call = {"name": "calculator", "arguments": {"expression": expression}}
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": question},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"type": "function", "function": call}],
                    },
                    {"role": "tool", "content": truth},
                    {"role": "assistant", "content": f"#### {truth}"},
                ],
                "tools": [CALCULATOR_SCHEMA],
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_task(out: Path, train: int, val: int, sft: int, seed: int = 0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "train.jsonl", make_rows(train, seed, "train"))
    write_jsonl(out / "val.jsonl", make_rows(val, seed + 1, "val"))
    write_jsonl(out / "sft.jsonl", make_sft_rows(sft, seed + 2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train", type=int, default=256)
    parser.add_argument("--val", type=int, default=64)
    parser.add_argument("--sft", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write_task(args.out, args.train, args.val, args.sft, args.seed)
    print(f"wrote {args.train} train, {args.val} val, {args.sft} sft rows to {args.out}")


if __name__ == "__main__":
    main()
