"""``agentloop-studio`` (also ``python -m trainer.cli.studio``): the local web console for
building a tool environment (docs/studio.md).

    agentloop-studio                         # http://127.0.0.1:8787
    agentloop-studio --port 9000
    agentloop-studio --host 0.0.0.0 --token "$SECRET"   # beyond this machine: a token

It binds 127.0.0.1 unless told otherwise; any other address needs a token (``--token`` or
``AGENTLOOP_STUDIO_TOKEN``), which the page asks for. It runs user code only from paths typed
into it (tool configs, tool modules, reward files), as ``agentloop-train`` would."""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main", "parse_args"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOKEN_ENV = "AGENTLOOP_STUDIO_TOKEN"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="agentloop-studio", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument(
        "--runs-dir",
        default="studio_runs",
        help="where previews and runs without a folder of their own go (default ./studio_runs)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"required off loopback; default ${TOKEN_ENV}",
    )
    args = parser.parse_args(argv)
    if args.host not in LOOPBACK and not args.token:
        parser.error(
            f"--host {args.host} lets other machines in: give a --token (or set {TOKEN_ENV}), "
            "which the page will ask for"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import uvicorn

    from trainer.studio import create_app

    sys.stderr.write(f"agentloop-studio: open http://{args.host}:{args.port}/\n")
    app = create_app(args.token, args.runs_dir)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
