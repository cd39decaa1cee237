"""The BM25 retriever as an MCP server over stdio (one tool, ``search``).

    python recipes/search_r1/search_server.py --index data/search_r1/index

Listed in an MCP config file (``mcp_search.json``, written by ``data.py``), the rollout sees
the tool as ``retriever-search``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file from anywhere

from recipes.search_r1.retriever import Bm25Index, format_hits  # noqa: E402


def build_server(index: Bm25Index, default_k: int = 3) -> MCPServer:
    server = MCPServer("retriever")

    @server.tool()
    def search(query: str, topk: int = default_k) -> str:
        """Search the knowledge base; returns the best matching passages."""
        return format_hits(index.search(query, min(max(topk, 1), 10)))

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, required=True, help="folder built by data.py")
    parser.add_argument("--topk", type=int, default=3)
    args = parser.parse_args(argv)
    build_server(Bm25Index.load(args.index), args.topk).run("stdio")


if __name__ == "__main__":
    main()
