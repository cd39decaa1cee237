"""``agentloop-serve``: one engine behind the HTTP front (OpenAI ``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``; ``/generate``, ``/health``, ``/metrics``), standalone, no
Ray::

    agentloop-serve --model tiny-qwen3 --port 8000
"""

from __future__ import annotations

import argparse
import sys

from servers.config import ServerConfig
from trainer.cli.common import setup_logging
from trainer.cli.flags import add_dataclass_flags, flag_values

__all__ = ["NOT_FLAGS", "RESOLVED", "build_parser", "main"]

RESOLVED = ("model", "tokenizer", "chat_template")
"""ServerConfig fields whose flags take more than the field: a name or hub id for a folder, a
file for the template text (``trainer.models.resolve``); written out below."""

NOT_FLAGS = {
    "http": "agentloop-serve always starts the HTTP front",
    "weight_transfer": "no trainer sends weights to a standalone server",
    "recompute_kv_after_weight_update": "no trainer pushes weights under its running requests",
}
"""ServerConfig fields agentloop-serve does not offer, and why."""

GENERATED_SKIP = (*RESOLVED, *NOT_FLAGS)


def build_parser() -> argparse.ArgumentParser:
    """``agentloop-serve``'s flags: the three of ``RESOLVED``, then one per other ServerConfig
    field (``trainer.cli.flags``), its help the field's docstring."""
    parser = argparse.ArgumentParser(
        prog="agentloop-serve",
        description="Serve one model: OpenAI /v1/chat/completions, /v1/completions and "
        "/v1/models, /generate, /health, /metrics.",
    )
    parser.add_argument(
        "--model", required=True, help="model folder, asset name or hub id (org/name)"
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer folder, asset name or hub id (default: the model's)",
    )
    parser.add_argument(
        "--chat-template",
        default=None,
        help="Jinja chat template text or file for /v1/chat/completions (default: the tokenizer's)",
    )
    add_dataclass_flags(parser, ServerConfig, skip=GENERATED_SKIP, defaults={"port": 8000})
    return parser


def main(argv: list[str] | None = None) -> int:
    """``agentloop-serve``: one engine behind the HTTP front, standalone (no Ray)."""
    import asyncio

    from trainer.models import resolve_model
    from trainer.models.resolve import read_chat_template

    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        model = resolve_model(args.model)
        tokenizer = None
        if args.tokenizer:
            tokenizer = resolve_model(args.tokenizer, "--tokenizer", need_config=False)
        template = read_chat_template(args.chat_template, "--chat-template")
    except ValueError as exc:
        raise SystemExit(f"agentloop-serve: error: {exc}") from None
    try:
        config = ServerConfig(
            model=model,
            tokenizer=tokenizer,
            chat_template=template,
            **flag_values(args, ServerConfig, skip=GENERATED_SKIP),
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
    raise SystemExit(main())
