"""An MCP server built with the official Python SDK, for carapace's MCP back tests.

    python3 mcp_python_server.py --uds PATH      # Streamable HTTP on a Unix socket, /mcp
    python3 mcp_python_server.py --stdio         # stdio

Tools: `add` (structured output), `echo` (text), `fail` (the tool reports an error).
"""

import argparse

from pydantic import BaseModel

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("carapace-test-python")


class Sum(BaseModel):
    sum: int


@server.tool()
def add(a: int, b: int) -> Sum:
    """Add two integers."""
    return Sum(sum=a + b)


@server.tool()
def echo(message: str) -> str:
    """Echo the message back."""
    return f"echo: {message}"


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the reason."""
    raise ToolError(reason)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--uds")
    ap.add_argument("--stdio", action="store_true")
    args = ap.parse_args()
    if args.stdio:
        server.run("stdio")
        return
    import uvicorn

    from mcp.server.transport_security import TransportSecuritySettings

    # On a Unix socket the Host header is `localhost`, without a port.
    security = TransportSecuritySettings(allowed_hosts=["localhost"])
    app = server.streamable_http_app(transport_security=security)
    uvicorn.run(app, uds=args.uds, log_level="warning")


if __name__ == "__main__":
    main()
