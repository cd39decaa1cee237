"""``ServerCore``: one engine adapter plus metrics; what the Ray actor, the HTTP front and
the ``agentloop-serve`` CLI all drive."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any, Protocol

import torch

from servers.config import ServerConfig
from servers.metrics import ServerMetrics
from servers.types import GenerateInputError, TokenOutput, validate_request

__all__ = ["EngineAdapter", "ServerCore", "make_engine"]


class EngineAdapter(Protocol):
    vocab_size: int
    max_model_len: int

    async def start(self) -> None: ...
    async def generate(
        self, prompt_ids: list[int], params: dict[str, Any], request_id: str
    ) -> TokenOutput:
        """``params`` are already validated and normalised by ``validate_request``."""
        ...

    async def abort(self, request_id: str) -> None: ...
    async def begin_weight_update(self) -> None: ...
    async def update_weights_bucket(self, named: Iterable[tuple[str, torch.Tensor]]) -> int: ...
    async def finish_weight_update(self) -> int: ...
    async def sleep(self) -> None: ...
    async def wake_up(self) -> None: ...
    async def health(self) -> dict[str, Any]: ...
    def shutdown(self) -> None: ...


def make_engine(config: ServerConfig) -> EngineAdapter:
    if config.backend == "vllm":
        from servers.vllm import VLLMEngine

        return VLLMEngine(config)
    from servers.sglang import SGLangEngine

    return SGLangEngine(config)


class ServerCore:
    """Validates every request, counts it in the metrics and gives it an engine request id."""

    def __init__(self, config: ServerConfig, engine: EngineAdapter | None = None) -> None:
        self.config = config
        self.engine = engine if engine is not None else make_engine(config)
        self.metrics = ServerMetrics()

    async def start(self) -> None:
        await self.engine.start()

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any] | None = None,
        request_id: str | None = None,
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
            out = await self.engine.generate(prompt_ids, params, request_id)
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
