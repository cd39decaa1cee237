"""``AsyncServer``: the Ray actor that owns one engine and its HTTP front.

Contract (DESIGN.md): ``generate(GenerateRequest) -> TokenOutput``, ``abort``,
``sleep``/``wake_up``, one ``apply_weights(update)`` for every kind of weight update
(``servers/updates.py``; the kinds the engine takes are in ``weight_sync_info().updates``),
``health``, ``address``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from servers.config import ServerConfig
from servers.core import ServerCore
from servers.delta import DeltaBase
from servers.engines import make_engine
from servers.http import HttpFront, build_app
from servers.shm import SHM, engine_shm
from servers.types import GenerateRequest, TokenOutput
from servers.updates import (
    UPDATE_KINDS,
    AdapterUpdate,
    BucketUpdate,
    DeltaUpdate,
    StagedUpdate,
    TransferUpdate,
    WeightUpdate,
)
from servers.user_code import import_external_lib
from servers.weights import WeightSyncInfo

__all__ = ["AsyncServer"]

logger = logging.getLogger(__name__)


class AsyncServer:
    """Plain class; ``ServerGroup`` wraps it with ``ray.remote``. Usable in-process too."""

    def __init__(self, config: ServerConfig | dict[str, Any]) -> None:
        self.config = config if isinstance(config, ServerConfig) else ServerConfig(**config)
        import_external_lib(self.config.external_lib)
        self.core = ServerCore(self.config, make_engine(self.config))
        self._http: HttpFront | None = None
        self._loads = {"staged": 0, "buckets": 0, "adapter": 0, "transfer": 0, "delta": 0}
        """Weight updates this server loaded, by route (``weight_loads``)."""
        self._delta = DeltaBase()
        """Delta weight sync: the weights last loaded by a ``DeltaUpdate``, and their id."""

    async def start(self) -> dict[str, Any]:
        """Start the engine (and HTTP front); returns ``health()``."""
        await self.core.start()
        if self.config.http:
            chat = completions = None  # the OpenAI routes answer 501 without a serving layer
            api = self.core.engine.openai()  # vLLM's; None for SGLang
            if api is not None:
                chat, completions = api.chat, api.completions
            app = build_app(self.core, chat, completions)
            self._http = HttpFront(app, self.config.host, self.config.port)
            await self._http.start()
        return await self.health()

    async def generate(self, request: GenerateRequest) -> TokenOutput:
        """One turn; its ``request_id`` names the engine request (``abort``); lower
        ``priority`` is scheduled first (``scheduling_policy=priority``)."""
        return await self.core.generate(request)

    async def abort(self, request_id: str) -> None:
        await self.core.engine.abort(request_id)

    async def apply_weights(self, update: WeightUpdate) -> int:
        """Load a weight update of a kind this server accepts (``weight_sync_info().updates``):
        ``BucketUpdate`` -> the bucket's bytes (the tensors loaded at ``finish``),
        ``StagedUpdate`` -> tensors loaded, ``AdapterUpdate`` -> the adapter version now
        served, ``TransferUpdate`` -> 0, ``DeltaUpdate`` -> the bucket's bytes (at ``finish``
        the checksum of the weights now served). A kind the engine does not take raises
        ``NotImplementedError`` naming the kinds it does."""
        engine = self.core.engine
        if update.kind not in self._kinds():
            raise NotImplementedError(
                f"{self.config.backend} servers take no {update.kind} weight updates (they "
                f"take {', '.join(sorted(self._kinds()))}): send the weights as "
                "BucketUpdate buckets"
            )
        if update.kind in ("buckets", "staged", "transfer"):
            self._delta.id = None  # the served weights leave the delta base: next one whole
        match update:
            case BucketUpdate():
                return await self._apply_bucket(update)
            case TransferUpdate():
                await self._apply_transfer(update)
                return 0
            case DeltaUpdate():
                return await self._apply_delta(update)
            case StagedUpdate():
                self._check_writer(update.writer_node)
                loaded = await engine.load_staged(update.buckets)
            case AdapterUpdate():
                loaded = await engine.load_adapter(update.tensors, update.config)
        self._loads[update.kind] += 1
        return loaded

    async def _apply_bucket(self, update: BucketUpdate) -> int:
        engine = self.core.engine
        if update.begin:
            await engine.begin_weight_update()
        loaded = await engine.update_weights_bucket(update.named) if update.named else 0
        if update.finish:
            loaded = await engine.finish_weight_update()
            self._loads["buckets"] += 1
        return loaded

    def _kinds(self) -> frozenset[str]:
        """The engine's kinds, and ``delta`` where it loads staged files (the base is
        kept in them)."""
        kinds = self.core.engine.weight_updates
        return kinds | {"delta"} if "staged" in kinds else kinds

    async def _apply_delta(self, update: DeltaUpdate) -> int:
        """Establish or change the delta base, then (``finish``) load it whole; returns the
        bucket's bytes, or at ``finish`` the checksum of the weights now served."""
        import asyncio

        base = self._delta
        if update.begin:
            base.begin(update.base, update.target)
        if update.base is None:
            done = await asyncio.to_thread(base.stage, update.named) if update.named else 0
        else:
            done = await asyncio.to_thread(base.apply, update.entries)
        if update.finish:
            await self.core.engine.load_staged(base.wire())
            base.finish()
            self._loads["delta"] += 1
            return await asyncio.to_thread(base.checksum)
        return done

    async def _apply_transfer(self, update: TransferUpdate) -> None:
        """vLLM's weight-transfer API: a trainer drives these through vLLM's trainer-side
        engine, which sends the tensors itself (NCCL broadcast / CUDA IPC)."""
        engine = self.core.engine
        if update.step == "init":
            await engine.init_weight_transfer(update.info or {})
        elif update.step == "start":
            await engine.start_weight_transfer()
        elif update.step == "update":
            await engine.transfer_weights(update.info or {})
        elif update.step == "finish":
            await engine.finish_weight_transfer()
            self._loads["transfer"] += 1
        elif update.step == "shutdown":
            await engine.shutdown_weight_transfer()
        else:
            raise ValueError(
                f"TransferUpdate.step must be init, start, update, finish or shutdown, got "
                f"{update.step!r}"
            )

    @staticmethod
    def _check_writer(writer_node: str | None) -> None:
        """Staged files written on another Ray node cannot be read here."""
        here = _node_id()
        if writer_node is not None and here is not None and writer_node != here:
            raise ValueError(
                f"staged weights written on node {writer_node} cannot be read on node {here}: "
                "a server on another node gets its weights in buckets"
            )

    def weight_sync_info(self) -> WeightSyncInfo:
        """The serving dtype, the weight updates the engine takes, and this server's node."""
        kinds = self._kinds()
        return dataclasses.replace(
            self.core.engine.weight_sync_info(),
            updates=tuple(k for k in UPDATE_KINDS if k in kinds),
            node_id=_node_id(),
            delta_base=self._delta.id,
        )

    def weight_loads(self) -> dict[str, int]:
        """Weight updates loaded so far by kind: ``staged`` (a shared-memory file written on
        this node), ``buckets`` (Ray objects), ``adapter`` (LoRA), ``transfer`` (vLLM's
        NCCL/IPC), ``delta`` (delta weight sync)."""
        return dict(self._loads)

    async def sleep(self) -> None:
        await self.core.engine.sleep()

    async def wake_up(self) -> None:
        await self.core.engine.wake_up()

    async def health(self) -> dict[str, Any]:
        """The engine's state (``lora_version``: the adapter version requests run on, 0 for
        none) and ``address``."""
        info = await self.core.engine.health()
        return {**info, "address": self.address()}

    def address(self) -> str | None:
        """Base URL of the HTTP front (None when it is off)."""
        return self._http.url if self._http else None

    def shm_footprint(self) -> dict[str, Any]:
        """``{"node_id", "names"}``: this server's Ray node (None outside Ray) and the
        ``/dev/shm`` entries its engine's processes map, its engine's scratch folder and its
        LoRA adapter folder, which a kill would leave behind (``ServerGroup`` removes them
        after one)."""
        node_id = _node_id()
        names = engine_shm()
        engine = self.core.engine
        # vLLM's engine scratch folder, and its adapter folder with lora_rank; else None
        for folder in (engine.scratch, engine.adapter_root):
            if folder is not None and folder.parent == SHM:
                names.append(folder.name)
        return {"node_id": node_id, "names": names}

    def metrics_text(self) -> str:
        return self.core.metrics.text().decode()

    async def shutdown(self) -> None:
        if self._http is not None:
            await self._http.stop()
            self._http = None
        self.core.engine.shutdown()
        self._delta.close()


def _node_id() -> str | None:
    """This process's Ray node (None outside Ray)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
