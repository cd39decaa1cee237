"""Delta weight sync without a server: the trainer's encoder (``trainer.workers.weight_delta``)
against the server's base (``servers.delta``), every entry checked against the tensor it must
produce, who gets the weights whole, and the settings refused."""

from __future__ import annotations

import math

import pytest
import torch

from servers.delta import DeltaBase, DeltaEntry, apply_entry, weights_checksum
from tests.unit.trainer.test_async_trainer import _config
from trainer.config.run import WeightSyncDeltaConfig
from trainer.workers.weight_delta import DeltaSender, DeltaSpec, changed_positions


def _weights(seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a.weight": (torch.randn(64, 32, generator=g) * 0.02).to(dtype),
        "b.weight": (torch.randn(300, generator=g) * 0.02).to(dtype),
        "c.steps": torch.arange(5),
    }


def _step(weights: dict[str, torch.Tensor], lr: float, seed: int) -> dict[str, torch.Tensor]:
    """An Adam-sized step on the float32 master weights, cast back to each tensor's dtype."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in weights.items():
        if t.is_floating_point():
            master = t.float() + lr * torch.randn(t.shape, generator=g).sign()
            out[name] = master.to(t.dtype)
        else:
            out[name] = t.clone()
    return out


def _push(sender: DeltaSender, server: dict[str, torch.Tensor], new: dict[str, torch.Tensor]):
    """One push to one server holding ``sender.id`` (or none): apply what is sent to its copy."""
    (whole,), _, target = sender.begin([sender.id if server else None])
    entries = []
    for name, tensor in new.items():
        if whole:
            sender.keep(name, tensor)
            server[name] = tensor.clone()
        elif (entry := sender.encode(name, tensor)) is not None:
            entries.append(entry)
            apply_entry(server[name], entry)
    return whole, entries, sender.finish(target)


def test_changed_positions_compare_bits_so_signed_zeros_and_nans_count():
    old = torch.tensor([0.0, 1.0, math.nan, 2.0, math.nan])
    new = torch.tensor([-0.0, 1.0, math.nan, 2.5, 1.0])
    expected = [
        k for k in range(5) if old[k : k + 1].view(torch.int32) != new[k : k + 1].view(torch.int32)
    ]
    assert changed_positions(old, new).tolist() == expected == [0, 3, 4]


def test_indices_send_the_changed_bf16_elements_and_the_server_ends_bit_equal():
    sender, server = DeltaSender(DeltaSpec(full_every=0)), {}
    weights = _weights()
    whole, _, first = _push(sender, server, weights)
    assert whole and first == weights_checksum(server.items())
    new = _step(weights, 1e-5, seed=1)  # most bf16 values round back to themselves
    whole, entries, checksum = _push(sender, server, new)
    assert not whole
    for entry in entries:
        reference = [
            k
            for k in range(new[entry.name].numel())
            if new[entry.name].reshape(-1)[k].view(torch.int16)
            != weights[entry.name].reshape(-1)[k].view(torch.int16)
        ]
        assert entry.index is not None and entry.index.tolist() == reference
        assert torch.equal(entry.values, new[entry.name].reshape(-1)[reference])
    assert {e.name for e in entries} <= {"a.weight", "b.weight"}  # the integer entry is unchanged
    sent = sum(e.nbytes for e in entries)
    assert 0 < sent < sum(t.numel() * t.element_size() for t in new.values()) / 2
    for name in new:
        assert torch.equal(server[name].view(torch.uint8), new[name].view(torch.uint8))
    assert checksum == weights_checksum(new.items()) == weights_checksum(server.items())


def test_a_tensor_changed_nearly_everywhere_goes_whole_and_an_unchanged_one_not_at_all():
    sender, server = DeltaSender(DeltaSpec(full_every=0)), {}
    weights = _weights(dtype=torch.float32)
    _push(sender, server, weights)
    new = dict(weights, **{"a.weight": weights["a.weight"] + 1e-3})
    _, entries, _ = _push(sender, server, new)
    assert [(e.name, e.index) for e in entries] == [("a.weight", None)]
    assert torch.equal(entries[0].values, new["a.weight"])
    _, entries, _ = _push(sender, server, new)
    assert entries == []


def test_bf16_differences_keep_the_server_and_the_shadow_bit_equal_and_carry_the_rounding():
    sender, server = DeltaSender(DeltaSpec(encoding="bf16_diff", full_every=0)), {}
    weights = _weights(dtype=torch.float32)
    _push(sender, server, weights)
    current = weights
    for seed in range(1, 4):
        current = _step(current, 1e-4, seed)
        whole, entries, checksum = _push(sender, server, current)
        assert not whole
        floats = [e for e in entries if e.name != "c.steps"]
        assert all(e.add and e.values.dtype == torch.bfloat16 and e.index is None for e in floats)
        assert checksum == weights_checksum(server.items())  # server == what the trainer holds
        for name in ("a.weight", "b.weight"):
            assert torch.equal(server[name], sender.shadow[name])
            # what is served stays within one bf16 rounding of a difference of the weights
            gap = (server[name] - current[name]).abs().max().item()
            assert gap <= 2**-8 * 4e-4, gap
    assert sum(e.nbytes for e in floats) == sum(
        current[n].numel() * 2 for n in ("a.weight", "b.weight")
    )


def test_who_gets_the_weights_whole():
    sender = DeltaSender(DeltaSpec(full_every=3))
    assert sender.begin([None, None])[0] == [True, True]  # the first push
    sender.id = "s-1"
    whole, base, target = sender.begin(["s-1", "s-1"])
    assert (whole, base) == ([False, False], "s-1") and target != "s-1"
    sender.id = target
    assert sender.begin([target, None])[0] == [False, True]  # a restarted server holds none
    sender.id = "s-3"
    assert sender.begin(["s-3", "s-3"])[0] == [True, True]  # every 3rd push is whole
    sender.id = "s-4"
    assert sender.begin(["s-4", "old"])[0] == [False, True]  # another base: whole


def test_min_change_skips_small_changes_until_they_add_up_but_not_in_a_push_with_a_whole_server():
    sender = DeltaSender(DeltaSpec(min_change=1e-3, full_every=0))
    base = {"w": torch.ones(100)}
    server: dict[str, torch.Tensor] = {}
    _push(sender, server, base)
    small = {"w": torch.ones(100) * (1 + 4e-4)}
    assert _push(sender, server, small)[1] == []  # 4e-4 relative: skipped, the server lags
    larger = {"w": torch.ones(100) * (1 + 1.2e-3)}
    (_, entries, _) = _push(sender, server, larger)
    assert [e.name for e in entries] == ["w"] and torch.equal(server["w"], larger["w"])
    tiny = {"w": larger["w"] * (1 + 1e-5)}
    (whole, _, target) = sender.begin([sender.id, None])  # one server restarted: exact for all
    assert whole == [False, True]
    assert sender.encode("w", tiny["w"]) is not None
    sender.finish(target)


def test_the_server_base_applies_entries_in_its_files_and_reports_the_trainers_checksum():
    sender, weights = DeltaSender(DeltaSpec(full_every=0)), _weights()
    base = DeltaBase()
    try:
        (whole,), _, target = sender.begin([None])
        base.begin(None, target)
        for name, tensor in weights.items():
            sender.keep(name, tensor)
        base.stage(list(weights.items()))
        base.finish()
        assert base.id == target and base.checksum() == sender.finish(target)
        new = _step(weights, 1e-5, seed=2)
        (whole,), held, target = sender.begin([base.id])
        assert not whole
        entries = [e for n, t in new.items() if (e := sender.encode(n, t)) is not None]
        base.begin(held, target)
        assert base.id is None  # half done: the next push would be whole
        base.apply(entries)
        base.finish()
        assert base.checksum() == sender.finish(target) == weights_checksum(new.items())
        with pytest.raises(ValueError) as info:
            base.begin("another", "next")
        assert str(info.value) == (
            f"delta weight update against base 'another', but this server holds {target!r}: "
            "send the weights whole (DeltaUpdate with base=None)"
        )
        base.begin(target, "next")
        with pytest.raises(ValueError) as info:
            base.apply([DeltaEntry("nope.weight", torch.zeros(1))])
        assert str(info.value) == (
            "delta weight update names 'nope.weight', which the base does not hold"
        )
    finally:
        base.close()


@pytest.mark.parametrize(
    "changes,message",
    [
        (
            {"trainer__weight_sync_delta__enable": True, "actor_rollout_ref__model__lora_rank": 8},
            "trainer.weight_sync_delta.enable=True is for full fine-tuning; a LoRA actor sends "
            "only its adapter already: drop it, or set actor_rollout_ref.model.lora_rank=0",
        ),
        (
            {
                "trainer__weight_sync_delta__enable": True,
                "actor_rollout_ref__rollout__engine__weight_transfer": "nccl",
            },
            "trainer.weight_sync_delta.enable=True sends over the host route; "
            "actor_rollout_ref.rollout.weight_transfer=nccl sends every weight GPU to GPU: set "
            "weight_transfer=host, or drop it",
        ),
    ],
)
def test_delta_sync_beside_lora_or_gpu_transfer_fails_at_start_up(
    tmp_path, tokenizer, changes, message
):
    config = _config(tmp_path, tokenizer, **changes)
    with pytest.raises(ValueError) as info:
        config.check_delta_sync()
    assert str(info.value) == message


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"encoding": "zstd"},
            "trainer.weight_sync_delta.encoding='zstd': use indices or bf16_diff",
        ),
        ({"full_every": -1}, "trainer.weight_sync_delta.full_every must be >= 0 (0: never)"),
        ({"min_change": -0.1}, "trainer.weight_sync_delta.min_change must be >= 0"),
    ],
)
def test_bad_delta_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError) as info:
        WeightSyncDeltaConfig(**kwargs)
    assert str(info.value) == message


def test_the_shadow_is_a_copy_so_a_live_parameter_moved_in_place_is_seen_as_changed():
    """With one rank (or an unsharded entry) the gathered tensor is the live parameter; the
    optimizer then moves it in place, and the next push must still send the change."""
    sender, server = DeltaSender(DeltaSpec(full_every=0)), {}
    live = {"w": torch.zeros(8)}
    _push(sender, server, live)
    live["w"][3] = 1.0  # an optimizer step, in place
    _, entries, checksum = _push(sender, server, live)
    assert [(e.name, e.index.tolist(), e.values.tolist()) for e in entries] == [("w", [3], [1.0])]
    assert torch.equal(server["w"], live["w"]) and checksum == weights_checksum(live.items())
