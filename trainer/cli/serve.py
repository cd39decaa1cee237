"""``agentloop-serve``: one engine behind the HTTP front (OpenAI ``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``; ``/generate``, ``/health``, ``/metrics``), standalone, no
Ray::

    agentloop-serve --model tiny-qwen3 --port 8000
"""

from __future__ import annotations

import argparse
import sys

from trainer.cli.common import setup_logging

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``agentloop-serve``: one engine behind the HTTP front, standalone (no Ray)."""
    import asyncio
    from dataclasses import fields

    from servers.config import ServerConfig
    from trainer.models import resolve_model
    from trainer.models.resolve import read_chat_template

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
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let transformers run code shipped with the model and tokenizer",
    )
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
        "--scheduling-policy",
        choices=["priority", "fcfs"],
        default="priority",
        help="priority: /generate's lower 'priority' runs first (default); fcfs: arrival order",
    )
    parser.add_argument("--max-num-seqs", type=int, default=None)
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
        help="HTTP requests generating at once, a chat request with n choices counting as n; "
        "more get 503 with Retry-After (default 256)",
    )
    limits = {f.name: f.default for f in fields(ServerConfig)}
    parser.add_argument(
        "--max-n",
        type=int,
        default=limits["max_n"],
        help=f"most choices (n) one chat request may ask for; more is a 400 (default "
        f"{limits['max_n']})",
    )
    parser.add_argument(
        "--max-tokens-per-request",
        type=int,
        default=limits["max_tokens_per_request"],
        help="largest max_tokens one HTTP request may ask for, per choice; more is a 400 "
        f"(default {limits['max_tokens_per_request']})",
    )
    parser.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=limits["max_prompt_tokens"],
        help="longest prompt one HTTP request may send, in tokens (chat: after the template); "
        "more is a 400 (default: the model length)",
    )
    args = parser.parse_args(argv)
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
            trust_remote_code=args.trust_remote_code,
            chat_template=template,
            backend=args.backend,
            host=args.host,
            port=args.port,
            max_model_len=args.max_model_len,
            dtype=args.dtype,
            tensor_parallel_size=args.tensor_parallel_size,
            gpu_memory_utilization=args.gpu_memory_utilization,
            cpu_kvcache_space_gib=args.cpu_kvcache_space_gib,
            served_model_name=args.served_model_name,
            scheduling_policy=args.scheduling_policy,
            max_num_seqs=args.max_num_seqs,
            api_key=args.api_key,
            max_concurrent_requests=args.max_concurrent_requests,
            max_n=args.max_n,
            max_tokens_per_request=args.max_tokens_per_request,
            max_prompt_tokens=args.max_prompt_tokens,
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
