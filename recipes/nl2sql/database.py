"""A generated shop database (SQLite): customers, products and orders from a seed."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

__all__ = ["SCHEMA", "build_database"]

SCHEMA = """\
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL,
                       price REAL NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers,
                     product_id INTEGER NOT NULL REFERENCES products, quantity INTEGER NOT NULL,
                     day INTEGER NOT NULL);
"""

CITIES = ["Lyon", "Oslo", "Quito", "Perth", "Turin", "Kyoto"]
NAMES = ["Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea"]
PRODUCTS = [
    ("pen", "office", 1.5),
    ("stapler", "office", 7.0),
    ("lamp", "home", 24.0),
    ("mug", "home", 6.5),
    ("kettle", "home", 31.0),
    ("cable", "tech", 9.0),
    ("mouse", "tech", 18.0),
    ("keyboard", "tech", 45.0),
]


def build_database(path: str | Path, seed: int = 0, orders: int = 120) -> Path:
    """Write the database to ``path`` (replaced if present); same seed, same rows."""
    path = Path(path)
    path.unlink(missing_ok=True)
    rng = random.Random(seed)
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA)
        db.executemany(
            "INSERT INTO customers VALUES (?, ?, ?)",
            [(i + 1, name, rng.choice(CITIES)) for i, name in enumerate(NAMES)],
        )
        db.executemany(
            "INSERT INTO products VALUES (?, ?, ?, ?)",
            [(i + 1, *p) for i, p in enumerate(PRODUCTS)],
        )
        db.executemany(
            "INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
            [
                (
                    i + 1,
                    rng.randint(1, len(NAMES)),
                    rng.randint(1, len(PRODUCTS)),
                    rng.randint(1, 5),
                    rng.randint(1, 30),
                )
                for i in range(orders)
            ],
        )
    db.close()
    return path
