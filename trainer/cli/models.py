"""``agentloop-models``: list the offline model assets, or build one and print its folder::

agentloop-models list
agentloop-models prepare tiny-qwen3
"""

from __future__ import annotations

import argparse
import sys

from trainer.cli.common import setup_logging

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
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
    setup_logging()

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


if __name__ == "__main__":
    raise SystemExit(main())
