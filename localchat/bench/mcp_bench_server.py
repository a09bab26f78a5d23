"""A small MCP server for ``localchat bench --tools``: three plain tools over stdio, written with
the ``mcp`` SDK as a user's server would be. ``python -m localchat.bench.mcp_bench_server``."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench-tools")


@server.tool()
def echo(text: str) -> str:
    """Return the text as it was given."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def word_count(text: str) -> int:
    """How many words the text has."""
    return len(text.split())


if __name__ == "__main__":
    server.run("stdio")
