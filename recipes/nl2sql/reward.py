"""Tool-verified reward for NL-to-SQL: run the model's final SQL and the gold SQL through the
registered ``run_sql`` tool and compare their result sets.

The final SQL is the last ```sql``` block (or ``<answer>...</answer>``) of the response, else
the query of the model's last successful ``run_sql`` call. Rows are compared as multisets
(order matters only when the gold query has ORDER BY); columns by position, values with floats
rounded to 6 places.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from recipes.nl2sql.tools import parse_result

__all__ = ["final_sql", "verify"]

_BLOCK = re.compile(r"```sql\s*(.*?)```", re.S | re.I)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def final_sql(solution_str: str, calls: list[dict[str, Any]]) -> str | None:
    for pattern in (_BLOCK, _ANSWER):
        found = pattern.findall(solution_str)
        if found and found[-1].strip():
            return found[-1].strip()
    for call in reversed(calls):
        if call["name"] == "run_sql" and call["ok"]:
            return str((call["arguments"] or {}).get("query", "")) or None
    return None


def _norm(row: list[Any]) -> tuple[Any, ...]:
    return tuple(round(v, 6) if isinstance(v, float) else v for v in row)


async def verify(sample: Any, tools: Any) -> dict[str, float]:
    sql = final_sql(sample.solution_str, sample.extra_info["calls"])
    if sql is None:
        return {"score": 0.0, "executed": 0.0}
    gold = await tools.call("run_sql", {"query": sample.ground_truth})
    if not gold.ok:
        raise ValueError(f"the gold SQL of sample {sample.index} fails: {gold.text}")
    mine = await tools.call("run_sql", {"query": sql})
    if not mine.ok:
        return {"score": 0.0, "executed": 0.0}
    _, gold_n, gold_rows = parse_result(gold.text)
    _, n, rows = parse_result(mine.text)
    if "order by" in str(sample.ground_truth).lower():
        same = [_norm(r) for r in rows] == [_norm(r) for r in gold_rows]
    else:
        same = Counter(map(_norm, rows)) == Counter(map(_norm, gold_rows))
    return {"score": float(same and n == gold_n), "executed": 1.0}
