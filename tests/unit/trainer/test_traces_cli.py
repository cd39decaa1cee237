"""``agentloop-traces`` without a UI: which store it opens, and clear errors."""

from __future__ import annotations

import pytest

from trainer.cli.traces import find_store, main


def test_no_run_under_the_root_is_a_clear_error(tmp_path, capsys):
    assert main(["--root", str(tmp_path), "--no-ui"]) == 2
    assert capsys.readouterr().err == (
        f"agentloop-traces: error: no run with an MLflow store under {tmp_path}/: pass "
        "--run-dir or --store (runs write <run dir>/mlruns.db with "
        "trainer.logger=[...,mlflow] or rollout.trace.backend=mlflow)\n"
    )


def test_a_run_folder_without_a_store_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError) as err:
        find_store(str(tmp_path))
    assert str(err.value) == (
        f"{tmp_path / 'mlruns.db'} does not exist: pass the run folder of a run with traces"
    )


def test_the_newest_store_under_the_root_is_picked(tmp_path):
    import os

    old, new = tmp_path / "a" / "mlruns.db", tmp_path / "b" / "mlruns.db"
    for path, mtime in ((old, 1_000_000), (new, 2_000_000)):
        path.parent.mkdir()
        path.write_bytes(b"")
        os.utime(path, (mtime, mtime))
    assert find_store(None, str(tmp_path)) == (f"sqlite:///{new.resolve()}", new.parent)
