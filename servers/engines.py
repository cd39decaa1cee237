"""The engine adapter contract every backend implements, and the one place that picks a
backend from ``ServerConfig.backend`` (the backend modules import vLLM or SGLang, so they are
imported only when chosen)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch

from servers.config import ServerConfig
from servers.types import GenerateRequest, TokenOutput
from servers.weights import WeightSyncInfo

__all__ = ["EngineAdapter", "make_engine"]


class EngineAdapter(Protocol):
    vocab_size: int
    max_model_len: int

    async def start(self) -> None: ...
    async def generate(self, request: GenerateRequest) -> TokenOutput:
        """``request`` is checked: its ``sampling_params`` validated and normalised by
        ``validate_request`` (``max_tokens`` and ``logprobs`` set) and its ``request_id``
        set; the adapter translates the params to its engine's. Lower ``priority`` is
        scheduled first where the engine supports it."""
        ...

    async def abort(self, request_id: str) -> None: ...
    async def begin_weight_update(self) -> None: ...
    async def update_weights_bucket(self, named: Iterable[tuple[str, torch.Tensor]]) -> int: ...
    async def finish_weight_update(self) -> int: ...
    def weight_sync_info(self) -> WeightSyncInfo:
        """Serving dtype and the ways weights can reach the engine (vLLM also has
        ``load_staged``, ``load_adapter`` and the ``*_weight_transfer`` methods behind them)."""
        ...

    async def sleep(self) -> None: ...
    async def wake_up(self) -> None: ...
    async def health(self) -> dict[str, Any]: ...
    def shutdown(self) -> None: ...


def make_engine(config: ServerConfig) -> EngineAdapter:
    """The adapter for ``config.backend`` (not started: ``await engine.start()``)."""
    if config.backend == "vllm":
        from servers.vllm import VLLMEngine

        return VLLMEngine(config)
    from servers.sglang import SGLangEngine

    return SGLangEngine(config)
