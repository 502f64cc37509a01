"""An MCP server built with the official Python SDK, for carapace's MCP back tests.

    python3 mcp_python_server.py --uds PATH      # Streamable HTTP on a Unix socket, /mcp
    python3 mcp_python_server.py --stdio         # stdio

Tools: `add` (structured output), `echo` (text), `fail` (the tool reports an error),
`confirm` (asks the client to confirm by elicitation: an "input required" result in
2026-07-28, an `elicitation/create` request before), `count` (reports progress and logs),
`touch` (tells `subscriptions/listen` streams that a resource and the resource list changed).
Resources: `notes://public/readme`, `notes://public/deploy`, `notes://secret/plan`, the template
`notes://public/broken/{why}` (reading fails, its error naming a private key); prompts: `greet`,
`internal`.
"""

import argparse
from typing import Annotated

from pydantic import BaseModel

from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve
from mcp.server.mcpserver.exceptions import ResourceError, ToolError

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


class Confirmation(BaseModel):
    ok: bool


def ask(item: str) -> Elicit[Confirmation]:
    return Elicit(f"Really delete {item}?", Confirmation)


@server.tool()
def confirm(item: str, answer: Annotated[Confirmation, Resolve(ask)]) -> str:
    """Delete an item after the user confirms."""
    return f"deleted {item}" if answer.ok else f"kept {item}"


@server.tool()
async def count(n: int, ctx: Context) -> str:
    """Count to n, reporting progress and logging each step."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"step {i}")
        await ctx.log("debug" if i % 2 else "warning", f"step {i}")
    return f"counted to {n}"


@server.tool()
async def leak(ctx: Context) -> str:
    """Say a credential while working: in a log message and in a progress message."""
    await ctx.log("warning", "using AKIAIOSFODNN7EXAMPLE for the upload")
    await ctx.report_progress(1, 1, "token ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789")
    return "uploaded"


@server.tool()
async def touch(uri: str, ctx: Context) -> str:
    """Say that the resource `uri` changed, and that the list of resources did."""
    await ctx.notify_resource_updated(uri)
    await ctx.notify_resources_changed()
    return f"touched {uri}"


@server.resource("notes://public/readme")
def readme() -> str:
    """Public notes."""
    return "public notes"


@server.resource("notes://public/deploy")
def deploy() -> str:
    """Notes that hold a private key by mistake."""
    return "deploy with -----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"


@server.resource("notes://public/broken/{why}")
def broken(why: str) -> str:
    """Notes whose reading fails with an error that names a private key by mistake."""
    raise ResourceError(
        f"{why}: -----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
    )


@server.resource("notes://secret/plan")
def plan() -> str:
    """Secret notes."""
    return "the secret plan"


@server.prompt()
def greet(name: str) -> str:
    """Greet someone."""
    return f"Say hello to {name}."


@server.prompt()
def internal() -> str:
    """Not for everyone."""
    return "internal instructions"


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
