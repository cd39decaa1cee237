"""``ServerCore``: one engine adapter plus metrics; what the Ray actor, the HTTP front and
the ``agentloop-serve`` CLI all drive. It knows no backend: the engine is handed to it
(``servers.engines.make_engine`` builds one from a ``ServerConfig``)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from servers.config import ServerConfig
from servers.engines import EngineAdapter
from servers.metrics import ServerMetrics
from servers.types import GenerateInputError, TokenOutput, validate_request

__all__ = ["ServerCore"]


class ServerCore:
    """Validates every request, counts it in the metrics and gives it an engine request id."""

    def __init__(self, config: ServerConfig, engine: EngineAdapter) -> None:
        self.config = config
        self.engine = engine
        self.metrics = ServerMetrics()

    async def start(self) -> None:
        await self.engine.start()

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any] | None = None,
        request_id: str | None = None,
        priority: int = 0,
    ) -> TokenOutput:
        request_id = request_id or uuid.uuid4().hex
        m = self.metrics
        m.in_flight.inc()
        start = time.perf_counter()
        try:
            params = validate_request(
                prompt_ids,
                sampling_params,
                vocab_size=self.engine.vocab_size,
                max_model_len=self.engine.max_model_len,
            )
            out = await self.engine.generate(prompt_ids, params, request_id, priority)
        except GenerateInputError:
            m.errors.labels("bad_request").inc()
            raise
        except Exception:  # a cancelled request (client gone) is not an engine error
            m.errors.labels("engine").inc()
            raise
        finally:
            m.in_flight.dec()
        m.latency.observe(time.perf_counter() - start)
        m.requests.labels(out.finish_reason).inc()
        m.prompt_tokens.inc(len(prompt_ids))
        m.generated_tokens.inc(len(out.token_ids))
        return out
