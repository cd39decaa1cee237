"""The trainer ranks' side of weight sync: what every rank runs in ``FSDPWorker.push_weights``
(``trainer/loop/weight_sync.py`` is the driver's side).

The servers say what they serve in and how weights can reach them
(``AsyncServer.weight_sync_info``); the ranks agree on one route per push:

Each server gets its own route, chosen by Ray node id (never by whether a file happens to be
readable: a test cluster's nodes share one machine's ``/dev/shm``):

- ``staged``: a vLLM server on the node of every rank (always so on one CPU node).
  Each rank casts its own FSDP shard to the serving dtype on its device and writes it into one
  shared-memory file at the shard's place in the full tensor (``shard_pieces``): no all-gather,
  no Ray object, no copy in the server; rank 0 then asks each server to load the file in place.
- ``buckets``: the other servers (on another node, or SGLang). The ranks all-gather one entry
  at a time in the serving dtype; rank 0 sends buckets of ``bucket_bytes`` as Ray objects,
  which each server stages and loads.
- ``delta`` (``trainer.weight_sync_delta.enable``): every host-route server that takes delta
  updates. Rank 0 gathers the tensors like ``buckets`` and sends each server either the
  weights whole or only what changed since the weights it holds, then checks each server's
  checksum (``trainer.workers.weight_delta``).
- ``nccl`` / ``ipc``: servers started with ``weight_transfer=nccl|ipc`` (vLLM, GPU). vLLM's
  trainer-side weight-transfer engine sends the full tensors from the GPUs (an NCCL broadcast
  from rank 0, or CUDA IPC handles to engines on the ranks' own GPUs), never through the host.

Every route reaches a server through its one ``apply_weights(update)`` (``servers.updates``),
with the update kind the server declares it takes (``WeightSyncInfo.updates``).

Floating-point weights always travel in the dtype the servers serve in, cast on the trainer's
device first: bf16 on GPU is half the bytes of the float32 master weights.

A LoRA actor (``actor_rollout_ref.model.lora_rank > 0``) sends only its adapter:

- ``adapter``: the ranks all-gather the adapter weights (megabytes, not gigabytes); rank 0
  sends them with the adapter config as one Ray object, and each server loads them as its
  next adapter version through vLLM's LoRA API (an ``AdapterUpdate``).
- ``merged``: a server that cannot load adapters (SGLang, a server started without LoRA)
  gets the full weights with the adapter merged in, by the ``buckets`` route; said once.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from servers.updates import (
    AdapterUpdate,
    BucketUpdate,
    DeltaUpdate,
    StagedUpdate,
    TransferUpdate,
)
from servers.weights import (
    StagedBucket,
    WeightSyncInfo,
    bucket_size,
    new_staging_file,
    plan_bucket,
    reserve_staging_file,
)
from trainer.workers.dist import this_rank, world_size
from trainer.workers.fsdp import free_port, full_tensors, shard_pieces
from trainer.workers.weight_delta import DeltaSender, DeltaSpec

__all__ = [
    "FullTensorSource",
    "ServerTransferClient",
    "SharedFile",
    "WeightSender",
    "serving_dtype",
    "stage_shards",
    "transfer_init_info",
]

logger = logging.getLogger(__name__)


def serving_dtype(infos: list[WeightSyncInfo]) -> torch.dtype:
    """The one dtype all servers serve in (float32 where none says)."""
    names = {i.dtype for i in infos if i.dtype is not None}
    if len(names) > 1:
        raise ValueError(f"the rollout servers serve in different dtypes: {sorted(names)}")
    return getattr(torch, names.pop()) if names else torch.float32


def _wire_dtype(dtype: torch.dtype, serving: torch.dtype) -> torch.dtype:
    return serving if dtype.is_floating_point else dtype


class WeightSender:
    """One per trainer rank; keeps the shared-memory file and vLLM's transfer engine from one
    push to the next. Every method is collective over the trainer's process group."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.rank = this_rank()
        self._file: SharedFile | None = None
        self._transfer: tuple[tuple[str, ...], Any] | None = None
        self._last_routes: list[str] | None = None
        self._nodes: set[str] | None = None  # every rank's Ray node
        self._delta: DeltaSender | None = None  # rank 0, delta sync: what the servers hold
        from servers.lora import adapter_rank
        from trainer.workers.lora import adapter_config, is_lora

        self._lora_rank = adapter_rank(adapter_config(model)) if is_lora(model) else 0

    def push(
        self,
        servers: list[Any],
        bucket_bytes: int,
        route: str | None = None,
        delta: DeltaSpec | None = None,
    ) -> dict[str, Any]:
        """Send the current weights to every server; returns tensors and bytes sent and
        ``routes``: the route each server got them by, in order (and with ``delta``, how many
        got the weights whole). ``route`` forces one route for all (benchmarks, tests); None
        picks per server. ``delta``: delta sync for every host-route server that takes it."""
        import ray

        infos: list[WeightSyncInfo] = ray.get([s.weight_sync_info.remote() for s in servers])
        dtype = serving_dtype(infos)
        routes = [route] * len(servers) if route else self._routes(infos, delta is not None)
        if "delta" in routes and self.rank == 0:
            if self._delta is None:
                self._delta = DeltaSender(delta or DeltaSpec())
            elif delta is not None:
                self._delta.spec = delta
        if self._lora_rank and set(routes) - {"adapter", "merged"}:
            raise ValueError(
                f"a LoRA actor sends its adapter or merged weights (route adapter or merged), "
                f"not {route!r}"
            )
        if routes != self._last_routes and self.rank == 0:
            if "merged" in routes:
                logger.warning(
                    "weight sync: sending merged full weights, not the rank-%d LoRA adapter: "
                    "the rollout servers load adapters up to rank %s (0: none, as with "
                    "actor_rollout_ref.rollout.lora_sync=merged or SGLang)",
                    self._lora_rank,
                    min(i.lora_rank for i in infos),
                )
            logger.info("weight sync: routes %s, %s", ", ".join(routes), dtype)
        self._last_routes = routes
        out: dict[str, Any] = {"tensors": 0.0, "bytes": 0.0, "routes": routes}
        for each in dict.fromkeys(routes):  # in order of first use; the same on every rank
            picked = [k for k, r in enumerate(routes) if r == each]
            chosen = [servers[k] for k in picked]
            their = [infos[k] for k in picked]
            if each == "delta":
                sent = self._push_delta(chosen, their, picked, dtype, bucket_bytes)
            else:
                sent = self._push_route(each, chosen, their, dtype, bucket_bytes)
            for key, value in sent.items():
                out[key] = max(out[key], value) if key == "tensors" else out.get(key, 0.0) + value
        return out

    def _push_route(
        self,
        route: str,
        servers: list[Any],
        infos: list[WeightSyncInfo],
        dtype: torch.dtype,
        bucket_bytes: int,
    ) -> dict[str, float]:
        if route == "adapter":
            return self._push_adapter(servers, dtype)
        if route == "merged":
            return self._push_buckets(servers, dtype, bucket_bytes, merged=True)
        if route == "staged":
            return self._push_staged(servers, dtype)
        if route == "buckets":
            return self._push_buckets(servers, dtype, bucket_bytes)
        if route in ("nccl", "ipc"):
            return self._push_transfer(servers, infos, dtype, route)
        raise ValueError(
            f"route must be staged, buckets, delta, nccl, ipc, adapter or merged, got {route!r}"
        )

    def _routes(self, infos: list[WeightSyncInfo], delta: bool = False) -> list[str]:
        """The route of each server. A LoRA actor: ``adapter`` where every server loads its
        rank, else ``merged``; vLLM's transfer where the servers were started for it; with
        ``delta``, ``delta`` for every server that takes it; else ``staged`` for a server that
        loads shared-memory files on the node of every trainer rank (each rank writes its
        shard into a file on its own node), ``buckets`` for the others. Chosen by Ray node id,
        so the same on every rank."""
        if self._lora_rank:
            fits = all(i.lora_rank >= self._lora_rank for i in infos)
            return ["adapter" if fits else "merged"] * len(infos)
        transfers = {i.transfer for i in infos}
        if len(transfers) > 1:
            raise ValueError(f"the rollout servers use different weight_transfer: {transfers}")
        if transfers != {"host"}:
            return [transfers.pop()] * len(infos)
        if delta:
            return ["delta" if "delta" in i.updates else "buckets" for i in infos]
        rank_nodes = self._rank_nodes()
        return [
            "staged" if i.loads_staged and rank_nodes == {i.node_id} else "buckets" for i in infos
        ]

    def _rank_nodes(self) -> set[str]:
        """The Ray nodes of every trainer rank (collective, asked once)."""
        if self._nodes is None:
            import ray

            here = ray.get_runtime_context().get_node_id()
            nodes = [here] * world_size()
            if dist.is_initialized():
                dist.all_gather_object(nodes, here)
            self._nodes = set(nodes)
        return self._nodes

    # ---- staged: each rank writes its shard into shared memory ----------------------------
    def _push_staged(self, servers: list[Any], dtype: torch.dtype) -> dict[str, float]:
        import ray

        plan, self._file = stage_shards(self.model, dtype, self._file)
        if self.rank == 0:
            node = ray.get_runtime_context().get_node_id()
            update = StagedUpdate([plan.to_wire()], writer_node=node)
            ray.get([s.apply_weights.remote(update) for s in servers])
        return {"tensors": float(len(plan.tensors)), "bytes": float(plan.nbytes)}

    # ---- buckets: gathered on rank 0, sent as Ray objects ---------------------------------
    def _push_buckets(
        self, servers: list[Any], dtype: torch.dtype, bucket_bytes: int, merged: bool = False
    ) -> dict[str, float]:
        """``merged``: a LoRA actor's weights with the adapter merged in."""

        def update(named: list, begin: bool, finish: bool) -> BucketUpdate:
            return BucketUpdate(named, begin=begin, finish=finish)

        stream = _Stream(servers if self.rank == 0 else [], update, bucket_bytes)
        # Tied embeddings: the server copies the embedding into its head.
        if merged:
            from trainer.workers.lora import merged_tensors

            source = merged_tensors(self.model, dtype=dtype, skip_tied_head=True)
        else:
            source = full_tensors(self.model, dtype=dtype, skip_tied_head=True)
        tensors = 0
        for name, tensor in source:
            tensors += 1
            stream.add((name, tensor), tensor.numel() * tensor.element_size())
        stream.flush(last=True)
        return {"tensors": float(tensors), "bytes": float(stream.sent)}

    # ---- delta: only what changed since the weights each server holds --------------------
    def _push_delta(
        self,
        servers: list[Any],
        infos: list[WeightSyncInfo],
        indices: list[int],
        dtype: torch.dtype,
        bucket_bytes: int,
    ) -> dict[str, float]:
        """Gathered like ``buckets``; rank 0 sends the servers that hold no base (or another)
        the weights whole and the others ``DeltaEntry`` items, then checks their checksums.
        Returns tensors, bytes (all servers' streams) and ``whole_servers``."""
        state = self._delta
        if state is None:  # not rank 0: take part in the gathers only
            tensors = sum(1 for _ in full_tensors(self.model, dtype=dtype, skip_tied_head=True))
            return {"tensors": float(tensors), "bytes": 0.0}
        whole, base, target = state.begin([i.delta_base for i in infos])

        def update(base_id: str | None):
            def make(items: list, begin: bool, finish: bool) -> DeltaUpdate:
                key = "named" if base_id is None else "entries"
                return DeltaUpdate(target, base_id, begin=begin, finish=finish, **{key: items})

            return make

        pairs = list(zip(servers, whole, strict=True))
        full = _Stream([s for s, w in pairs if w], update(None), bucket_bytes)
        part = _Stream([s for s, w in pairs if not w], update(base), bucket_bytes)
        tensors = 0
        for name, tensor in full_tensors(self.model, dtype=dtype, skip_tied_head=True):
            tensors += 1
            full.add((name, tensor), tensor.numel() * tensor.element_size())  # no-op if none
            if not part.servers:
                state.keep(name, tensor)
            elif (entry := state.encode(name, tensor)) is not None:
                part.add(entry, entry.nbytes)
        answers = full.flush(last=True) + part.flush(last=True)
        expected = state.finish(target)
        order = [k for k, w in enumerate(whole) if w] + [k for k, w in enumerate(whole) if not w]
        if expected is not None:
            for k, got in zip(order, answers, strict=True):
                if got != expected:
                    raise RuntimeError(
                        f"weight sync: server {indices[k]} ({_actor_name(servers[k])}) holds "
                        f"weights with checksum {got:#010x} after delta push {target}, but "
                        f"the trainer's are {expected:#010x}: its copy of the weights is not "
                        "the trainer's (a base file changed outside the sync?); restart it "
                        "and it gets the weights whole"
                    )
        return {
            "tensors": float(tensors),
            "bytes": float(full.sent + part.sent),  # each bucket once, as on other routes
            "whole_servers": float(sum(whole)),
        }

    # ---- adapter: a LoRA actor's adapter, loaded as the servers' next version -------------
    def _push_adapter(self, servers: list[Any], dtype: torch.dtype) -> dict[str, float]:
        import ray

        from trainer.workers.lora import adapter_config, adapter_tensors

        tensors = dict(adapter_tensors(self.model, dtype=dtype))  # collective: every rank
        if self.rank == 0:
            ref = ray.put(AdapterUpdate(tensors, adapter_config(self.model)))
            ray.get([s.apply_weights.remote(ref) for s in servers])
        sent = sum(t.numel() * t.element_size() for t in tensors.values())
        return {"tensors": float(len(tensors)), "bytes": float(sent)}

    # ---- nccl / ipc: vLLM's weight-transfer API, GPU to GPU -------------------------------
    def _push_transfer(
        self, servers: list[Any], infos: list[WeightSyncInfo], dtype: torch.dtype, backend: str
    ) -> dict[str, float]:
        key = tuple(s._actor_id.hex() for s in servers)
        if self._transfer is None or self._transfer[0] != key:
            # First push, or a restarted server: a new group of exactly these servers.
            self._close_transfer()
            self._transfer = (key, self._new_transfer(servers, infos, dtype, backend))
        engine = self._transfer[1]
        engine.send_weights()
        meta = engine.source.metadata()
        sent = sum(m.dtype.itemsize * torch.Size(m.shape).numel() for m in meta)
        return {"tensors": float(len(meta)), "bytes": float(sent)}

    def _new_transfer(
        self, servers: list[Any], infos: list[WeightSyncInfo], dtype: torch.dtype, backend: str
    ) -> Any:
        import ray
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

        client = ServerTransferClient(servers, [i.workers for i in infos])
        if self.rank == 0:  # drop what an earlier group left on the servers (no-op otherwise)
            ray.get([s.apply_weights.remote(TransferUpdate("shutdown")) for s in servers])
        address = ray.util.get_node_ip_address()  # only rank 0's (the sender's) is used
        info = transfer_init_info(backend, self.rank, infos, address, free_port())
        source = FullTensorSource(self.model, dtype)
        return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)

    def _close_transfer(self) -> None:
        if self._transfer is not None:
            self._transfer[1].shutdown()
            self._transfer = None

    def close(self) -> None:
        """Release the shared file (rank 0 removes it) and any NCCL group."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._close_transfer()


class _Stream:
    """Items in buckets of about ``bucket_bytes`` to ``servers`` (rank 0's; empty on the
    others): each bucket one Ray object for every server; ``make(items, begin, finish)``
    builds the update; the first begins it, the last (maybe empty) finishes it."""

    def __init__(self, servers: list[Any], make: Any, bucket_bytes: int) -> None:
        self.servers, self.make, self.bucket_bytes = servers, make, bucket_bytes
        self.items: list[Any] = []
        self.size = self.sent = 0
        self.first = True

    def add(self, item: Any, nbytes: int) -> None:
        if not self.servers:
            return
        self.items.append(item)
        self.size += nbytes
        if self.size >= self.bucket_bytes:
            self.flush()

    def flush(self, last: bool = False) -> list[Any]:
        """Send the bucket so far; returns each server's answer (empty if nothing sent)."""
        import ray

        answers: list[Any] = []
        if self.servers and (self.items or last):
            ref = ray.put(self.make(self.items, self.first, last))
            answers = ray.get([s.apply_weights.remote(ref) for s in self.servers])
            self.sent += self.size
            self.first = False
        self.items, self.size = [], 0
        return answers


def _actor_name(server: Any) -> str:
    actor = getattr(server, "_actor_id", None)
    return f"actor {actor.hex()[:12]}" if actor is not None else type(server).__name__


def stage_shards(
    model: torch.nn.Module, dtype: torch.dtype, shared: SharedFile | None = None
) -> tuple[StagedBucket, SharedFile]:
    """Every rank writes its own shard of every state-dict entry, floating-point ones cast to
    ``dtype`` on the trainer's device, at its place in one shared-memory file; returns the
    layout (one staged bucket: the whole model) and the file (``shared``, kept when the layout
    still fits). Collective; on return every rank's writes are done.

    Tied embeddings are written once: the server copies the embedding into its head.
    """
    pieces = shard_pieces(model, skip_tied_head=True)
    entries = [(p.name, _wire_dtype(p.dtype, dtype), p.shape) for p in pieces]
    nbytes = bucket_size(plan_bucket("", entries))
    if shared is None or shared.nbytes != nbytes:
        if shared is not None:
            shared.close()
        shared = SharedFile(nbytes)
    plan = plan_bucket(shared.path, entries)
    for piece, meta in zip(pieces, plan.tensors, strict=True):
        if piece.local is None:
            continue
        local = piece.local.to(_wire_dtype(piece.dtype, dtype))  # cast on the device, then copy
        whole = shared.buffer[meta.offset : meta.offset + meta.nbytes].view(local.dtype)
        whole[piece.start : piece.start + local.numel()].copy_(local.reshape(-1))
    if dist.is_initialized():
        dist.barrier()  # every shard is in place before anyone reads the file
    return plan, shared


class SharedFile:
    """One shared-memory file every trainer rank maps; rank 0 creates it (its pid in the
    name, so a killed trainer's file is swept by the next writer), reserves its memory up
    front and removes it. Collective to create."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.rank = this_rank()
        path = [new_staging_file() if self.rank == 0 else None]
        if self.rank == 0:
            try:
                reserve_staging_file(path[0], nbytes)
            except OSError:
                _unlink(path[0])
                raise
        if dist.is_initialized():
            dist.broadcast_object_list(path, src=0)
        self.path: str = path[0]
        self.buffer = torch.from_file(self.path, shared=True, size=nbytes, dtype=torch.uint8)

    def close(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)  # unmaps
        if self.rank == 0:
            _unlink(self.path)


def _unlink(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def transfer_init_info(
    backend: str, rank: int, infos: list[WeightSyncInfo], address: str, port: int
) -> Any:
    """vLLM's trainer-side init info for ``nccl`` (one NCCL group: trainer rank 0, then every
    engine worker of every server) or ``ipc`` (packed buffers of bounded size)."""
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(
            master_address=address,
            master_port=port,
            world_size=1 + sum(i.workers for i in infos),
            rank=rank,
        )
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(rank=rank, packed=True)
    raise ValueError(f"weight_transfer={backend!r}: vLLM's transfer backends are nccl and ipc")


class ServerTransferClient:
    """vLLM's ``VLLMWeightSyncClient`` over our ``AsyncServer`` actors: each call goes to every
    server and waits for all. vLLM numbers one engine's NCCL ranks from ``rank_offset``; each
    server here is its own engine, so each gets the offset after the previous servers' workers.
    """

    def __init__(self, servers: list[Any], workers: list[int]) -> None:
        self.servers, self.workers = servers, workers

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        import ray

        calls, before = [], 0
        for server, workers in zip(self.servers, self.workers, strict=True):
            info = dict(init_info)
            if "rank_offset" in info:
                info["rank_offset"] += before
            calls.append(server.apply_weights.remote(TransferUpdate("init", info)))
            before += workers
        ray.get(calls)

    def start_weight_update(self) -> None:
        import ray

        ray.get([s.apply_weights.remote(TransferUpdate("start")) for s in self.servers])

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        import ray

        update = TransferUpdate("update", update_info)
        ray.get([s.apply_weights.remote(update) for s in self.servers])

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        import ray

        ray.get([s.apply_weights.remote(TransferUpdate("finish")) for s in self.servers])


class FullTensorSource:
    """vLLM's ``WeightSource`` over an FSDP2 model: full tensors in the serving dtype, left on
    the trainer's GPU (each one all-gathered when iterated: every rank iterates in step).

    Tied embeddings: ``lm_head.weight`` comes last as the gathered embedding (no second
    all-gather), since vLLM's in-place reload gives the head a load of its own.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        self.model, self.dtype = model, dtype
        self.tied = bool(getattr(model.config, "tie_word_embeddings", False))

    def _entries(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        state = self.model.state_dict()
        out = [
            (k, _wire_dtype(v.dtype, self.dtype), tuple(v.shape))
            for k, v in state.items()
            if not (self.tied and k == "lm_head.weight")
        ]
        if self.tied:
            embed = next(e for e in out if e[0].endswith("embed_tokens.weight"))
            out.append(("lm_head.weight", embed[1], embed[2]))
        return out

    def metadata(self) -> list[Any]:
        """Name, dtype and full shape of what iteration yields, in order, without a gather."""
        from vllm.distributed.weight_transfer import ParamMeta

        return [ParamMeta(name, dtype, shape) for name, dtype, shape in self._entries()]

    def __iter__(self):
        embed = None
        for name, tensor in full_tensors(
            self.model, dtype=self.dtype, device=None, skip_tied_head=self.tied
        ):
            if self.tied and name.endswith("embed_tokens.weight"):
                embed = tensor
            yield name, tensor
        if self.tied:
            yield "lm_head.weight", embed
