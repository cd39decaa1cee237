"""The calculator task's rows for a gateway agent: ``recipes.calculator.data``'s rows with
``agent_name`` set to one loop of ``examples/gateway/agents.yaml``.

python -m examples.gateway.data --out data/calculator_gateway --agent gateway_openai
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from recipes.calculator.data import make_rows, write_jsonl

__all__ = ["gateway_rows", "main"]

AGENTS = (
    "gateway_openai",
    "gateway_agents_sdk",
    "gateway_langgraph",
    "gateway_smolagents",
    "gateway_summarizing",
)


def gateway_rows(n: int, seed: int, split: str, agent: str) -> list[dict[str, Any]]:
    """``n`` calculator rows for ``agent``; the tool's kwargs are dropped (the agent brings
    its own tools)."""
    rows = make_rows(n, seed, split)
    for row in rows:
        row["agent_name"] = agent
        row["extra_info"].pop("tools_kwargs", None)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--agent", choices=AGENTS, default="gateway_openai")
    parser.add_argument("--train", type=int, default=256)
    parser.add_argument("--val", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "train.jsonl", gateway_rows(args.train, args.seed, "train", args.agent))
    write_jsonl(args.out / "val.jsonl", gateway_rows(args.val, args.seed + 1, "val", args.agent))
    print(f"wrote {args.train} train, {args.val} val rows for {args.agent} to {args.out}")


if __name__ == "__main__":
    main()
