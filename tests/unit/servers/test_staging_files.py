"""Shared-memory weight staging files: orphans of killed servers are swept."""

from __future__ import annotations

import os

import torch

from servers.weights import new_staging_file, read_bucket, stage_bucket, sweep_orphans


def test_new_staging_file_removes_files_of_dead_owners_only(dead_pid, tmp_path):
    orphan = tmp_path / f"agentloop-weights-{dead_pid}-abc.bin"
    orphan.write_bytes(b"x" * 64)
    mine = tmp_path / f"agentloop-weights-{os.getpid()}-def.bin"
    mine.write_bytes(b"y")
    unrelated = tmp_path / "other.bin"
    unrelated.write_bytes(b"z")

    path = new_staging_file(tmp_path)

    assert not orphan.exists()
    assert mine.exists() and unrelated.exists()
    assert os.path.basename(path).startswith(f"agentloop-weights-{os.getpid()}-")
    assert sweep_orphans(tmp_path) == 0


def test_staged_bucket_round_trips(tmp_path):
    path = new_staging_file(tmp_path)
    weights = {"a": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.ones(4).bfloat16()}
    bucket = stage_bucket(weights.items(), path)
    got = dict(read_bucket(bucket))
    assert bucket.nbytes == 6 * 4 + 4 * 2
    assert torch.equal(got["a"], weights["a"]) and torch.equal(got["b"], weights["b"])
