"""A vLLM engine's temporary files, in one folder its server removes.

vLLM puts its engine's temporary files in the temp dir and leaves them there: the ZeroMQ
``ipc://`` sockets between a server and its engine-core process (six ``/tmp/<uuid>`` per
engine) and the ``vllm_dist_<hex>`` file store of its distributed set-up, neither removed at
shutdown (measured on vLLM 0.32: seven entries per engine start). A server therefore starts its
engine with the temp dir pointed at a folder of its own (``agentloop-vllm-<pid>-*``, in
``/dev/shm`` like the weight staging files) and removes the folder when it stops; a killed
server's folder goes with the rest of its shared memory (``ServerGroup``), or at the next
server's start on the node (``sweep_orphans``, by the owner's pid).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["SCRATCH_PREFIX", "engine_temp_dir", "new_engine_scratch"]

SCRATCH_PREFIX = "agentloop-vllm-"


def new_engine_scratch(directory: Path) -> Path:
    """Create an empty folder in ``directory`` for one engine's temporary files, named after
    this process (its owner); the caller removes it."""
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=directory))


@contextmanager
def engine_temp_dir(folder: Path) -> Iterator[None]:
    """While the engine starts, the temp dir is ``folder``: in this process (``tempfile``,
    where vLLM names its sockets) and for the processes it starts (``TMPDIR``, which they
    keep for their life). Restored afterwards."""
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = str(folder)
    try:
        yield
    finally:
        tempfile.tempdir = saved_dir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
