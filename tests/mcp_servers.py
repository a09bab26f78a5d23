"""Real MCP servers for the tests, written with the ``mcp`` SDK (``MCPServer``, ``@server.tool()``).

``python tests/mcp_servers.py stdio [--banner]`` serves over stdio (``--banner`` first prints a
line of non-MCP text on stdout, as a careless server does); ``python tests/mcp_servers.py http
PORT`` serves streamable HTTP on 127.0.0.1:PORT/mcp. Well-behaved tools (``echo``, ``add``,
``environment``) sit beside misbehaving ones: ``crash`` exits mid-call after a last word on stderr,
``hang`` never answers, ``garbage`` writes non-MCP lines onto the wire before answering, ``huge``
returns 10 MB, ``escapes`` returns terminal control sequences, ``fails`` reports a tool error.
"""

from __future__ import annotations

import json
import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("test-tools")

ESCAPES = ("\x1b[2J\x1b[H\x1b]0;pwned title\x07\x1b]52;c;ZWNobyBwd25lZA==\x07"
           "plain \x1b[31mred\x1b[0m text\u202e reversed\x9b6n end")


@server.tool()
def echo(text: str) -> str:
    """Return the text as it was given."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def environment() -> str:
    """The server's environment variables, as JSON."""
    return json.dumps(dict(os.environ))


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def crash() -> str:
    """Exit in the middle of the call."""
    sys.stderr.write("fatal: crashed on purpose\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool()
def hang() -> str:
    """Never answer."""
    time.sleep(3600)
    return "late"


@server.tool()
def garbage() -> str:
    """Write lines that are not MCP messages onto the wire, then answer."""
    from mcp.server import stdio

    claim = stdio._claims.get(1)  # the real stdout, which the SDK keeps away from print()
    if claim is not None and claim.private_fd is not None:
        os.write(claim.private_fd, b"this is not JSON-RPC\n{\"broken\": \n\x1b[31mnoise\n")
    return "answered after the garbage"


@server.tool()
def huge() -> str:
    """Ten megabytes of text."""
    return "0123456789" * 1_000_000


@server.tool()
def escapes() -> str:
    """Text full of terminal escape sequences."""
    return ESCAPES


@server.tool()
def fails() -> str:
    """Report a failure of the tool itself."""
    raise ToolError("the database is locked")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    sys.stderr.write(f"test-tools server starting ({mode})\n")
    sys.stderr.flush()
    if mode == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        if "--banner" in sys.argv:
            print("Test tools server v1 ready!", flush=True)
        server.run("stdio")
