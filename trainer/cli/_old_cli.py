"""Console scripts. They compose every layer, so they live in the top package."""

from __future__ import annotations

import argparse
import logging
import sys

__all__ = ["models_main", "serve_main"]


def models_main(argv: list[str] | None = None) -> int:
    """``agentloop-models``: list or build the offline model assets."""
    from trainer.models import MODELS, ModelAssetError, prepare

    parser = argparse.ArgumentParser(
        prog="agentloop-models", description="Build model assets offline (no model hub)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the assets that can be prepared")
    prep = sub.add_parser("prepare", help="build an asset once and print its folder")
    prep.add_argument("name", help="asset name (see `agentloop-models list`)")
    prep.add_argument("--dir", default=None, help="cache folder (default $AGENTLOOP_HOME/models)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    if args.command == "list":
        for spec in MODELS.values():
            sys.stdout.write(f"{spec.name}\t{spec.description}\n")
        return 0
    try:
        path = prepare(args.name, cache_dir=args.dir)
    except ModelAssetError as exc:
        sys.stderr.write(f"agentloop-models: error: {exc}\n")
        return 2
    sys.stdout.write(f"{path}\n")
    return 0


def hydra_argv(argv: list[str] | None, doc: str | None) -> list[str] | None:
    """The ``key=value`` overrides of a Hydra-config command (logging set up), or None when
    ``-h``/``--help`` printed the command's docstring."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(doc or "")
        return None
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return argv


def cli_error(prog: str, message: str) -> int:
    """One line on stderr saying what to change; exit code 2."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    return 2


def resolve_model(name_or_path: str, what: str = "--model") -> str:
    """A folder path as is; an ``agentloop-models`` asset name to its (prepared) cache folder.
    Raises ``ValueError`` naming ``what`` (the option or config key) otherwise."""
    from pathlib import Path

    from trainer.models import MODELS, prepare

    if name_or_path in MODELS:
        return str(prepare(name_or_path))
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        known = ", ".join(sorted(MODELS))
        raise ValueError(
            f"{what} {name_or_path!r} is neither a model folder nor a known asset name ({known})"
        )
    return str(path)


def serve_main(argv: list[str] | None = None) -> int:
    """``agentloop-serve``: one engine behind the HTTP front, standalone (no Ray)."""
    import asyncio

    from servers.config import ServerConfig

    parser = argparse.ArgumentParser(
        prog="agentloop-serve",
        description="Serve one model: OpenAI /v1/chat/completions, /generate, /health, /metrics.",
    )
    parser.add_argument("--model", required=True, help="model folder or asset name")
    parser.add_argument("--backend", choices=["vllm", "sglang"], default="vllm")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--cpu-kvcache-space-gib", type=int, default=1)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer <key>' on every route but GET /health "
        "(default $AGENTLOOP_API_KEY; unset means no auth)",
    )
    parser.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=256,
        help="HTTP requests generating at once; more get 503 with Retry-After (default 256)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        model = resolve_model(args.model)
    except ValueError as exc:
        raise SystemExit(f"agentloop-serve: error: {exc}") from None
    try:
        config = ServerConfig(
            model=model,
            backend=args.backend,
            host=args.host,
            port=args.port,
            max_model_len=args.max_model_len,
            dtype=args.dtype,
            tensor_parallel_size=args.tensor_parallel_size,
            gpu_memory_utilization=args.gpu_memory_utilization,
            cpu_kvcache_space_gib=args.cpu_kvcache_space_gib,
            served_model_name=args.served_model_name,
            api_key=args.api_key,
            max_concurrent_requests=args.max_concurrent_requests,
        )
    except ValueError as exc:
        sys.stderr.write(f"agentloop-serve: error: {exc}\n")
        return 2
    asyncio.run(_serve(config))
    return 0


async def _serve(config) -> None:
    import asyncio
    import signal

    from servers.actor import AsyncServer

    server = AsyncServer(config)
    await server.start()
    sys.stdout.write(f"serving {config.model} on {server.address()}\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.shutdown()


if __name__ == "__main__":
    raise SystemExit(models_main())
