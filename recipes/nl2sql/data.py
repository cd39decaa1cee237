"""Generate the NL-to-SQL task: a shop database and questions with gold SQL, as verl rows.

python -m recipes.nl2sql.data --out data/nl2sql --train 64 --val 16
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from recipes.nl2sql.database import CITIES, NAMES, PRODUCTS, SCHEMA, build_database

__all__ = ["make_rows", "main"]

SYSTEM = (
    "You answer questions about a shop database by writing SQLite queries. You may call "
    "run_sql to try queries. End with the final query in a ```sql``` block.\n\nSchema:\n" + SCHEMA
)


def _tasks(rng: random.Random) -> tuple[str, str]:
    city, name = rng.choice(CITIES), rng.choice(NAMES)
    product, category = rng.choice(PRODUCTS)[0], rng.choice(["office", "home", "tech"])
    day = rng.randint(5, 25)
    options = [
        (
            f"How many customers live in {city}?",
            f"SELECT COUNT(*) FROM customers WHERE city = '{city}'",
        ),
        (
            f"How many items of {product} were ordered in total?",
            "SELECT COALESCE(SUM(o.quantity), 0) FROM orders o JOIN products p ON "
            f"p.id = o.product_id WHERE p.name = '{product}'",
        ),
        (
            f"Which products in the {category} category cost more than 8?",
            f"SELECT name FROM products WHERE category = '{category}' AND price > 8",
        ),
        (
            f"How many orders did {name} place before day {day}?",
            "SELECT COUNT(*) FROM orders o JOIN customers c ON c.id = o.customer_id "
            f"WHERE c.name = '{name}' AND o.day < {day}",
        ),
        (
            f"List the names of customers in {city}, alphabetically.",
            f"SELECT name FROM customers WHERE city = '{city}' ORDER BY name",
        ),
    ]
    return rng.choice(options)


def make_rows(db_path: Path, n: int, seed: int, split: str) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        question, gold = _tasks(rng)
        rows.append(
            {
                "data_source": "nl2sql",
                "agent_name": "tool_agent",
                "prompt": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": question},
                ],
                "reward_model": {"style": "tool", "ground_truth": gold},
                "extra_info": {
                    "split": split,
                    "index": i,
                    "tools_kwargs": {"run_sql": {"create_kwargs": {"db_path": str(db_path)}}},
                },
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/nl2sql"))
    parser.add_argument("--train", type=int, default=64)
    parser.add_argument("--val", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    db = build_database(args.out / "shop.db", seed=args.seed).resolve()
    for split, n, seed in (("train", args.train, args.seed), ("val", args.val, args.seed + 1)):
        path = args.out / f"{split}.jsonl"
        rows = make_rows(db, n, seed, split)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{len(rows)} {split} rows -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
