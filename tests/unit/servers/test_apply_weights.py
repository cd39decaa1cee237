"""``AsyncServer.apply_weights``: one entry for every kind of weight update, each reaching the
engine method behind it, counted by kind, and refused by name where the engine lacks it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from servers.actor import AsyncServer
from servers.delta import DeltaBase, DeltaEntry, weights_checksum
from servers.updates import (
    AdapterUpdate,
    BucketUpdate,
    DeltaUpdate,
    StagedUpdate,
    TransferUpdate,
    bucket_updates,
)
from servers.weights import WeightSyncInfo


class RecordingEngine:
    """Records each weight call; takes the kinds it is given."""

    adapter_root = None
    scratch = None

    def __init__(self, kinds: set[str]) -> None:
        self.weight_updates = frozenset(kinds)
        self.calls: list[tuple] = []

    async def begin_weight_update(self) -> None:
        self.calls.append(("begin",))

    async def update_weights_bucket(self, named) -> int:
        self.calls.append(("bucket", [n for n, _ in named]))
        return 8

    async def finish_weight_update(self) -> int:
        self.calls.append(("finish",))
        return 3

    async def load_staged(self, buckets) -> int:
        self.calls.append(("staged", buckets))
        return 5

    async def load_adapter(self, tensors, config) -> int:
        self.calls.append(("adapter", sorted(tensors), config))
        return 2

    async def init_weight_transfer(self, info) -> None:
        self.calls.append(("init", info))

    async def start_weight_transfer(self) -> None:
        self.calls.append(("start",))

    async def transfer_weights(self, info) -> None:
        self.calls.append(("update", info))

    async def finish_weight_transfer(self) -> None:
        self.calls.append(("transfer_finish",))

    async def shutdown_weight_transfer(self) -> None:
        self.calls.append(("shutdown",))

    def weight_sync_info(self) -> WeightSyncInfo:
        return WeightSyncInfo(backend="vllm", dtype="float32", loads_staged=True)


def server_with(engine: RecordingEngine, backend: str = "vllm") -> AsyncServer:
    server = AsyncServer.__new__(AsyncServer)  # no engine process: the adapter is the fake
    server.config = SimpleNamespace(backend=backend)
    server.core = SimpleNamespace(engine=engine)
    server._loads = {"staged": 0, "buckets": 0, "adapter": 0, "transfer": 0, "delta": 0}
    server._delta = DeltaBase()
    return server


def test_bucket_updates_begin_with_the_first_bucket_and_finish_with_the_last():
    named = [(f"w{i}", torch.zeros(4)) for i in range(3)]  # 16 bytes each
    updates = list(bucket_updates(named, bucket_bytes=32))
    assert [([n for n, _ in u.named], u.begin, u.finish) for u in updates] == [
        (["w0", "w1"], True, False),
        (["w2"], False, True),
    ]
    (only,) = bucket_updates([], bucket_bytes=32)  # nothing to send still opens and loads
    assert (only.named, only.begin, only.finish) == ([], True, True)


def test_every_kind_reaches_its_engine_method_and_is_counted_once_loaded():
    engine = RecordingEngine({"buckets", "staged", "adapter", "transfer"})
    server = server_with(engine)

    async def run() -> list[int]:
        named = [("a", torch.zeros(4)), ("b", torch.zeros(4))]
        out = [await server.apply_weights(u) for u in bucket_updates(named, 16)]
        out.append(await server.apply_weights(StagedUpdate([{"path": "/dev/shm/x"}])))
        out.append(await server.apply_weights(AdapterUpdate({"t": torch.zeros(1)}, {"r": 8})))
        for step in ("shutdown", "init", "start", "update", "finish"):
            info = {"step": step} if step in ("init", "update") else None
            out.append(await server.apply_weights(TransferUpdate(step, info)))
        return out

    assert asyncio.run(run()) == [8, 3, 5, 2, 0, 0, 0, 0, 0]
    assert engine.calls == [
        ("begin",),
        ("bucket", ["a"]),
        ("bucket", ["b"]),
        ("finish",),
        ("staged", [{"path": "/dev/shm/x"}]),
        ("adapter", ["t"], {"r": 8}),
        ("shutdown",),
        ("init", {"step": "init"}),
        ("start",),
        ("update", {"step": "update"}),
        ("transfer_finish",),
    ]
    assert server.weight_loads() == {
        "staged": 1,
        "buckets": 1,
        "adapter": 1,
        "transfer": 1,
        "delta": 0,
    }


@pytest.mark.parametrize(
    ("update", "kind"),
    [
        (AdapterUpdate({}, {"r": 8}), "adapter"),
        (TransferUpdate("start"), "transfer"),
        (StagedUpdate([]), "staged"),
        (DeltaUpdate("v1"), "delta"),
    ],
)
def test_a_kind_the_engine_does_not_take_is_refused_before_it_is_called(update, kind):
    engine = RecordingEngine({"buckets"})
    server = server_with(engine, backend="sglang")
    with pytest.raises(NotImplementedError) as error:
        asyncio.run(server.apply_weights(update))
    assert str(error.value) == (
        f"sglang servers take no {kind} weight updates (they take buckets): send the weights "
        "as BucketUpdate buckets"
    )
    assert engine.calls == []


def test_weight_sync_info_declares_the_kinds_the_engine_takes():
    server = server_with(RecordingEngine({"transfer", "buckets", "staged"}))
    assert server.weight_sync_info().updates == ("buckets", "staged", "transfer", "delta")
    assert server_with(RecordingEngine({"buckets"})).weight_sync_info().updates == ("buckets",)
    assert BucketUpdate().kind == "buckets"


def test_a_delta_base_is_loaded_as_staged_files_changed_in_place_and_dropped_by_other_routes():
    """Any engine that loads staged files takes delta updates: the base is staged, loaded
    whole, answered with its checksum; a later delta changes it in place; a bucket update
    leaves the server with no base (its next delta push is whole)."""
    engine = RecordingEngine({"buckets", "staged"})
    server = server_with(engine)
    named = [("w", torch.arange(6, dtype=torch.float32)), ("b", torch.ones(2))]

    async def run() -> tuple[int, int]:
        first = await server.apply_weights(DeltaUpdate("s-1", None, named, begin=True, finish=True))
        assert server.weight_sync_info().delta_base == "s-1"
        poke = DeltaEntry("w", torch.tensor([9.0]), index=torch.tensor([2], dtype=torch.int32))
        update = DeltaUpdate("s-2", "s-1", entries=[poke], begin=True, finish=True)
        return first, await server.apply_weights(update)

    try:
        first, second = asyncio.run(run())
        assert first == weights_checksum(named)
        changed = dict(named, w=torch.tensor([0.0, 1, 9, 3, 4, 5]))
        assert second == weights_checksum(changed.items())
        assert [c[0] for c in engine.calls] == ["staged", "staged"]
        assert server.weight_sync_info().delta_base == "s-2"
        assert server.weight_loads()["delta"] == 2
        for update in bucket_updates(named, 64):
            asyncio.run(server.apply_weights(update))
        assert server.weight_sync_info().delta_base is None
    finally:
        server._delta.close()
