"""Benchmark tools: the calculator with the latency of a search or code tool."""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

from agentloop.tools.base import ToolResult
from agentloop.tools.calculator import CalculatorTool


class SlowCalculatorTool(CalculatorTool):
    """``calculator`` that first waits a lognormal time: median ``median_s`` (1 s), spread
    ``sigma`` (1.0: one call in ten waits over 3.6 s), capped at ``cap_s`` (10 s); seeded."""

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: Any = None) -> None:
        super().__init__(config, tool_schema)
        cfg = config or {}
        self.median_s = float(cfg.get("median_s", 1.0))
        self.sigma = float(cfg.get("sigma", 1.0))
        self.cap_s = float(cfg.get("cap_s", 10.0))
        self.rng = random.Random(int(cfg.get("seed", 0)))

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        wait = min(self.median_s * math.exp(self.rng.gauss(0.0, self.sigma)), self.cap_s)
        await asyncio.sleep(wait)
        return await super().execute(instance_id, arguments)
