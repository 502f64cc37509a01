"""The official Python MCP SDK as a client of carapace's MCP front.

    python3 mcp_python_client.py --uds PATH --mode auto|legacy|2026-07-28

Lists the tools, makes a good call, a call with bad arguments and a call to an unknown tool
over the Unix socket, and prints one JSON object with what it saw. Exits 1 when the SDK
reports anything unexpected (carapace's integration test checks the details).
"""

import argparse
import asyncio
import json
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def run(uds: str, mode: str) -> dict:
    http = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=uds), timeout=30)
    transport = streamable_http_client("http://localhost/mcp", http_client=http)
    seen = {"mode": mode}
    async with Client(transport, mode=mode) as client:
        seen["protocol_version"] = getattr(client, "protocol_version", None)
        tools = await client.list_tools()
        seen["tools"] = sorted(t.name for t in tools.tools)
        good = await client.call_tool("memory.append", {"text": f"from python ({mode})"})
        seen["good"] = {
            "is_error": bool(good.is_error),
            "structured": good.structured_content,
            "text": [c.text for c in good.content if getattr(c, "type", "") == "text"],
        }
        bad = await client.call_tool("memory.append", {"text": 5})
        seen["bad"] = {
            "is_error": bool(bad.is_error),
            "text": [c.text for c in bad.content if getattr(c, "type", "") == "text"],
        }
        try:
            unknown = await client.call_tool("memory.nope", {})
            seen["unknown"] = {"is_error": bool(unknown.is_error)}
        except Exception as e:  # the SDK raises on a JSON-RPC error
            seen["unknown"] = {"raised": type(e).__name__, "message": str(e)}
    return seen


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--uds", required=True)
    ap.add_argument("--mode", default="auto")
    a = ap.parse_args()
    seen = asyncio.run(run(a.uds, a.mode))
    print(json.dumps(seen))
    ok = (
        "memory.append" in seen["tools"]
        and not seen["good"]["is_error"]
        and seen["bad"]["is_error"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
