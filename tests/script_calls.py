"""A run script's commands without running them: ``bash script`` with ``PY`` a stand-in that
records each call's directory and arguments (one JSON line each) and prints ``SFT_FOLDER`` as
its last line (as ``agentloop-sft`` prints its export), so a test reads the exact
``key=value`` list a recipe's or example's run script passes to ``agentloop-train``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]

SFT_FOLDER = "/fake/sft/huggingface"

FAKE_PYTHON = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["SCRIPT_CALLS"], "a") as f:
    f.write(json.dumps({{"cwd": os.getcwd(), "args": sys.argv[1:]}}) + "\\n")
print({SFT_FOLDER!r})
"""


class Call(NamedTuple):
    cwd: Path
    """Where the call ran."""
    args: list[str]
    """After ``-m``: the module, then its arguments."""


def script_calls(
    script: str | Path, tmp: Path, *args: str, cwd: Path = REPO, **env: str
) -> list[Call]:
    """Each ``$PY`` call of ``bash script *args`` run in ``cwd`` with ``env``, in order."""
    tmp.mkdir(parents=True, exist_ok=True)
    fake, calls = tmp / "fake_python", tmp / "calls.jsonl"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    calls.unlink(missing_ok=True)
    proc = subprocess.run(
        ["bash", str(script), *args],
        cwd=cwd,
        env={**os.environ, **env, "PY": str(fake), "SCRIPT_CALLS": str(calls)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    if not calls.exists():
        return []
    records = [json.loads(line) for line in calls.read_text().splitlines()]
    return [Call(Path(r["cwd"]), r["args"]) for r in records]


def train_overrides(calls: list[Call]) -> list[str]:
    """The ``key=value`` arguments of the (one) ``-m trainer.cli.train`` call."""
    (train,) = [c.args for c in calls if c.args[:2] == ["-m", "trainer.cli.train"]]
    return train[2:]
