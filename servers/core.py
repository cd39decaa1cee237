"""``ServerCore``: one engine adapter plus metrics; what the Ray actor, the HTTP front and
the ``agentloop-serve`` CLI all drive. It knows no backend: the engine is handed to it
(``servers.engines.make_engine`` builds one from a ``ServerConfig``)."""

from __future__ import annotations

import dataclasses
import time
import uuid

from servers.config import ServerConfig
from servers.engines import EngineAdapter
from servers.metrics import ServerMetrics
from servers.types import GenerateInputError, GenerateRequest, TokenOutput, validate_request

__all__ = ["ServerCore"]


class ServerCore:
    """Validates every request, counts it in the metrics and gives it an engine request id."""

    def __init__(self, config: ServerConfig, engine: EngineAdapter) -> None:
        self.config = config
        self.engine = engine
        self.metrics = ServerMetrics()

    async def start(self) -> None:
        await self.engine.start()

    async def generate(self, request: GenerateRequest) -> TokenOutput:
        """Validate ``request``, give it an engine request id if it has none, and run it."""
        request_id = request.request_id or uuid.uuid4().hex
        m = self.metrics
        m.in_flight.inc()
        start = time.perf_counter()
        try:
            params = validate_request(
                request.prompt_ids,
                request.sampling_params,
                vocab_size=self.engine.vocab_size,
                max_model_len=self.engine.max_model_len,
            )
            checked = dataclasses.replace(request, sampling_params=params, request_id=request_id)
            out = await self.engine.generate(checked)
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
        m.prompt_tokens.inc(len(request.prompt_ids))
        m.generated_tokens.inc(len(out.token_ids))
        return out
