"""Generate the custom-operator task as verl rows for the ``math_expression`` loop.

python -m recipes.langgraph_agent.data --out data/langgraph_math --train 256 --val 32

Each row is an expression over ``@`` (``a @ b = 3a - 2b``, known only to the ``custom_op``
tool) with one to three operators, e.g. ``(4 @ 7) @ 2``; ground truth is its value.
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


def make_expression(rng: random.Random, ops: int) -> tuple[str, int]:
    """An expression with ``ops`` operators (parenthesised left or right) and its value."""
    text, value = str(n := rng.randint(1, 9)), n
    for _ in range(ops):
        m = rng.randint(1, 9)
        if rng.random() < 0.5:
            text, value = f"({text}) @ {m}" if "@" in text else f"{text} @ {m}", apply_op(value, m)
        else:
            text, value = f"{m} @ ({text})" if "@" in text else f"{m} @ {text}", apply_op(m, value)
    return text, value


def make_rows(n: int, seed: int, split: str, max_ops: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ops = rng.randint(1, max_ops)
        expression, value = make_expression(rng, ops)
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


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--train", type=int, default=256)
    parser.add_argument("--val", type=int, default=32)
    parser.add_argument("--max-ops", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.max_ops < 1:
        parser.error("--max-ops must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "train.jsonl", make_rows(args.train, args.seed, "train", args.max_ops))
    write_jsonl(args.out / "val.jsonl", make_rows(args.val, args.seed + 1, "val", args.max_ops))
    print(f"wrote {args.train} train and {args.val} val rows to {args.out}")


if __name__ == "__main__":
    main()
