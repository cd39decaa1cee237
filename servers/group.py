"""``ServerGroup``: the driver's handles on a group of ``AsyncServer`` actors, with health
checks and the restart of a server that died.

``handles`` is one list, changed in place when a server is replaced, so every holder of it
(weight sync, shutdown) sees the new actor. Agent-loop workers hold their own copies and are
told of a replacement by the ``AgentLoopManager``.

A killed engine cannot unlink its shared memory (``servers/shm.py``), so each started server
tells what its engine maps in ``/dev/shm``, and whoever kills it here (``restart``,
``stop_servers``) removes exactly those entries on the server's node afterwards.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from servers.actor import AsyncServer
from servers.config import ServerConfig
from servers.placement import on_nodes_with
from servers.shm import remove_shm

__all__ = ["ServerGroup", "ServerRestartError", "launch_servers", "stop_servers"]

logger = logging.getLogger(__name__)


class ServerRestartError(RuntimeError):
    """A dead server could not be replaced (restart budget spent or the new one failed)."""


@dataclass(slots=True)
class _Footprint:
    node_id: str | None
    """Ray node the server runs on (None: not under Ray)."""
    names: set[str]
    """``/dev/shm`` entries its engine's processes map."""


# Footprints by actor id, of every server started here: ``stop_servers`` gets only handles
# (the trainer holds ``group.handles``), and a dead server cannot be asked for its own.
_FOOTPRINTS: dict[str, _Footprint] = {}


def _actor_key(handle: Any) -> str:
    return handle._actor_id.hex()


def _record_shm(handle: Any, timeout_s: float = 30.0) -> None:
    """Ask a live server what its engine maps (a dead or busy one keeps what was recorded)."""
    import ray

    try:
        info = ray.get(handle.shm_footprint.remote(), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - dead or not answering: nothing new to learn
        return
    known = _FOOTPRINTS.setdefault(_actor_key(handle), _Footprint(info["node_id"], set()))
    known.names.update(info["names"])


def _remove_shm_of(handle: Any) -> None:
    """After ``handle``'s actor was killed: unlink what its engine mapped, on its node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    footprint = _FOOTPRINTS.pop(_actor_key(handle), None)
    if footprint is None or not footprint.names:
        return
    names = sorted(footprint.names)
    if footprint.node_id is None:
        remove_shm(names)
        return
    task = ray.remote(num_cpus=0)(remove_shm).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(footprint.node_id, soft=False)
    )
    try:
        ray.get(task.remote(names), timeout=60)
    except Exception as exc:  # noqa: BLE001 - a lost node took its /dev/shm with it
        logger.warning("could not remove a killed engine's shared memory: %s", _first_line(exc))


def _kill(handle: Any) -> None:
    """Kill a server's actor and remove the shared memory its engine leaves behind."""
    import ray

    _record_shm(handle, timeout_s=5.0)  # alive: what it maps now; dead: what it mapped
    ray.kill(handle, no_restart=True)
    _remove_shm_of(handle)


class ServerGroup:
    def __init__(
        self,
        config: ServerConfig,
        num_servers: int = 1,
        *,
        num_cpus: float = 1,
        num_gpus: float | None = None,
        name_prefix: str | None = None,
        max_restarts: int = 3,
        node_resource: str | None = None,
        wait: bool = True,
    ) -> None:
        """Start ``num_servers`` servers and wait until each is ready. ``num_gpus`` defaults
        to ``tensor_parallel_size`` when CUDA is visible, else 0. ``max_restarts``: servers
        this group may replace over its life; past it a death is a ``ServerRestartError``.
        ``node_resource``: only nodes declaring this Ray resource run them (a restarted
        server too: on one of them that remains; ``servers.placement``). ``wait=False``:
        return while the engines load (the caller starts other parts meanwhile) and call
        ``wait_ready`` before the first request."""
        import torch

        if num_gpus is None:
            num_gpus = float(config.tensor_parallel_size) if torch.cuda.is_available() else 0.0
        self.config = config
        self.max_restarts = max_restarts
        self.restarts = 0
        self._options: dict[str, Any] = {
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "max_concurrency": 10_000,
            **on_nodes_with(node_resource),
        }
        self._name_prefix = name_prefix
        self.handles: list[Any] = [self._create(i) for i in range(num_servers)]
        self._starting: list[Any] = [h.start.remote() for h in self.handles]
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Block until every server this group started is ready; raises what a failed start
        raised. Idempotent: later calls return at once."""
        import ray

        if not self._starting:
            return
        starting, self._starting = self._starting, []
        ray.get(starting)
        for handle in self.handles:
            _record_shm(handle)
        config = self.config
        logger.info("%d %s server(s) ready for %s", len(self.handles), config.backend, config.model)

    def _create(self, index: int) -> Any:
        import ray

        options = dict(self._options)
        if self._name_prefix:
            options["name"] = f"{self._name_prefix}-{index}-r{self.restarts}"
        return ray.remote(AsyncServer).options(**options).remote(asdict(self.config))

    def dead(self, timeout_s: float = 30.0) -> list[int]:
        """Indices of servers whose actor died or whose engine reports itself dead. A server
        that does not answer within ``timeout_s`` (busy) counts as alive."""
        import ray

        refs = [h.health.remote() for h in self.handles]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        answered = set(ready)
        out = []
        for index, ref in enumerate(refs):
            if ref not in answered:
                continue
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - actor gone or engine dead: both restart
                logger.warning("server %d is dead: %s", index, _first_line(exc))
                out.append(index)
        return out

    def restart(self, index: int) -> Any:
        """Replace server ``index`` with a new actor on the same config; returns its handle
        once its engine is ready. It starts from the model folder's weights."""
        import ray

        if self.restarts >= self.max_restarts:
            _kill(self.handles[index])  # dead all the same: free its shared memory
            raise ServerRestartError(
                f"server {index} died and {self.restarts} restart(s) were already spent "
                f"(max_restarts={self.max_restarts}): look at the server's log (OOM kill? "
                "engine error?)"
            )
        self.restarts += 1
        _kill(self.handles[index])
        handle = self._create(index)
        try:
            ray.get(handle.start.remote())
        except Exception as exc:
            _kill(handle)
            raise ServerRestartError(
                f"server {index} died and its replacement failed to start: {_first_line(exc)}"
            ) from exc
        self.handles[index] = handle
        _record_shm(handle)
        footprint = _FOOTPRINTS.get(_actor_key(handle))
        node = footprint.node_id if footprint is not None else None
        logger.warning(
            "server %d restarted (%d of %d) on node %s",
            index,
            self.restarts,
            self.max_restarts,
            node or "(not under Ray)",
        )
        return handle


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def launch_servers(
    config: ServerConfig,
    num_servers: int = 1,
    *,
    num_cpus: float = 1,
    num_gpus: float | None = None,
    name_prefix: str | None = None,
    node_resource: str | None = None,
) -> list[Any]:
    """Create and start ``num_servers`` ``AsyncServer`` actors; returns their handles (a
    ``ServerGroup``'s, for callers that do not restart servers).

    ``num_gpus`` defaults to ``tensor_parallel_size`` when CUDA is visible, else 0.
    """
    group = ServerGroup(
        config,
        num_servers,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        name_prefix=name_prefix,
        node_resource=node_resource,
    )
    return group.handles


def stop_servers(servers: list[Any]) -> None:
    """Shut every server's engine down and kill its actor (a dead one is just killed), then
    remove the shared memory a killed engine left."""
    import ray

    for server in servers:
        clean = False
        try:
            ray.get(server.shutdown.remote())
            clean = True  # its engine unlinked its own shared memory
        except Exception:  # noqa: BLE001 - a dead server has nothing left to shut down
            pass
        finally:
            ray.kill(server)
            if clean:
                _FOOTPRINTS.pop(_actor_key(server), None)
            else:
                _remove_shm_of(server)
