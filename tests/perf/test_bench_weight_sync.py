"""Weight sync benchmark (``make bench``): a full sync of smollm2-135m-instruct from 2 FSDP2
trainer ranks (gloo, Ray actors) into a running vLLM CPU server, end to end as the trainer
sees it (``WorkerGroup.push_weights``), by both routes on the same machine in the same run:

- ``buckets``: all-gather one tensor at a time, Ray objects to the server, which stages them in
  shared memory and loads them (the only route before the staged one; float32 on CPU, the
  serving dtype, so the same bytes as then);
- ``staged`` (the default on one node): each rank writes its shard into one shared-memory file,
  the server loads it in place.

Rounds alternate the routes, so load from other processes hits both alike; min, median and max
of each are printed. Also: the engine's load alone (the same file, loaded again), which is
the floor of either route. Target: the full sync < 1 s on the 2-core CPU machine.
Writes bench_results/weight_sync.json.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import ray
from safetensors.torch import load_file

from servers import ServerConfig, launch_servers
from servers.updates import StagedUpdate
from servers.weights import new_staging_file, stage_bucket
from tests.integration.cluster.helpers import cpu_spec
from trainer.models import prepare
from trainer.workers import WorkerGroup

ROUNDS = 7


def _spread(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def test_bench_weight_sync_smollm2_trainer_to_server(ray_local):
    path = prepare("smollm2-135m-instruct")
    (server,) = launch_servers(ServerConfig(model=str(path), max_model_len=1024, http=False))
    group = WorkerGroup(cpu_spec(path), 2)
    state = load_file(str(path / "model.safetensors"))
    staged_by_driver = stage_bucket(state.items(), new_staging_file())
    runs: dict[str, list[float]] = {"buckets": [], "staged": [], "engine_load": []}
    try:
        info = ray.get(server.weight_sync_info.remote())
        sent = {r: group.push_weights([server], 256 << 20, r) for r in ("buckets", "staged")}
        ray.get(server.apply_weights.remote(StagedUpdate([staged_by_driver.to_wire()])))  # warm-ups
        for _ in range(ROUNDS):
            for route in ("buckets", "staged"):
                t = time.perf_counter()
                group.push_weights([server], 256 << 20, route)
                runs[route].append(time.perf_counter() - t)
            t = time.perf_counter()
            ray.get(server.apply_weights.remote(StagedUpdate([staged_by_driver.to_wire()])))
            runs["engine_load"].append(time.perf_counter() - t)
    finally:
        Path(staged_by_driver.path).unlink(missing_ok=True)
        group.shutdown()
        ray.get(server.shutdown.remote())
        ray.kill(server)

    mb = sent["staged"]["bytes"] / 1e6
    result = {
        "model": "smollm2-135m-instruct",
        "serving_dtype": info.dtype,
        "megabytes": mb,
        "trainer_ranks": 2,
        **{route: {**_spread(xs), "all": xs} for route, xs in runs.items()},
    }
    out = Path("bench_results")
    out.mkdir(exist_ok=True)
    (out / "weight_sync.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"\n[bench] full weight sync, smollm2-135m-instruct ({mb:.0f} MB {info.dtype}), "
        f"2 gloo FSDP2 ranks -> vLLM CPU server, {ROUNDS} rounds (s)"
    )
    print(f"  {'route':<34}{'min':>7}{'median':>8}{'max':>7}")
    labels = {
        "buckets": "buckets (all-gather + Ray objects)",
        "staged": "staged (shards into shm)",
        "engine_load": "engine load alone",
    }
    for route, xs in runs.items():
        s = _spread(xs)
        print(f"  {labels[route]:<34}{s['min']:>7.2f}{s['median']:>8.2f}{s['max']:>7.2f}")
    print(f"  staged median < 1 s: {statistics.median(runs['staged']) < 1.0} (target)")
    assert sent["staged"]["bytes"] == sent["buckets"]["bytes"]
