"""``run_sql``: read-only SQL over the sample's SQLite database.

The database comes from the row's ``tools_kwargs.run_sql.create_kwargs.db_path``. The answer
is JSON lines: ``{"columns": [...], "rows": N}`` then one JSON array per row (at most
``max_rows``, config). Queries run in a thread on a read-only connection and are interrupted
after ``max_seconds``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from typing import Any

from agentloop.tools import BaseTool, ToolError, ToolResult

__all__ = ["RUN_SQL_SCHEMA", "SqlTool", "parse_result"]

RUN_SQL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "run_sql",
        "description": "Run one read-only SQLite query on the shop database and see its rows.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "One SELECT statement."}},
            "required": ["query"],
        },
    },
}


def parse_result(text: str) -> tuple[list[str], int, list[list[Any]]]:
    """``(columns, total rows, shown rows)`` of a ``run_sql`` answer."""
    lines = text.splitlines()
    head = json.loads(lines[0])
    return head["columns"], head["rows"], [json.loads(line) for line in lines[1:]]


class SqlTool(BaseTool):
    schema = RUN_SQL_SCHEMA

    def __init__(self, config: dict[str, Any] | None = None, tool_schema=None) -> None:
        super().__init__(config, tool_schema or RUN_SQL_SCHEMA)
        self.max_rows = int(self.config.get("max_rows", 50))
        self.max_seconds = float(self.config.get("max_seconds", 5.0))
        self._db: dict[str, str] = {}

    async def create(self, instance_id: str | None = None, **create_kwargs: Any) -> str:
        instance_id = await super().create(instance_id)
        if "db_path" not in create_kwargs:
            raise ToolError("run_sql needs tools_kwargs.run_sql.create_kwargs.db_path in the row")
        self._db[instance_id] = str(create_kwargs["db_path"])
        return instance_id

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ToolError("run_sql needs a non-empty 'query' string")
        text = await asyncio.to_thread(self._run, self._db[instance_id], query)
        return ToolResult(text)

    def _run(self, db_path: str, query: str) -> str:
        deadline = time.monotonic() + self.max_seconds
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        db.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        try:
            cursor = db.execute(query)
            rows = cursor.fetchall()
            columns = [d[0] for d in cursor.description or []]
        except sqlite3.Error as exc:
            raise ToolError(f"SQL error: {exc}") from None
        finally:
            db.close()
        head = json.dumps({"columns": columns, "rows": len(rows)})
        shown = [json.dumps(list(r)) for r in rows[: self.max_rows]]
        return "\n".join([head, *shown])

    async def release(self, instance_id: str) -> None:
        self._db.pop(instance_id, None)
