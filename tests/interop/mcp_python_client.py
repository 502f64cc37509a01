"""The official Python MCP SDK as a client of carapace's MCP front.

    python3 mcp_python_client.py --uds PATH --mode auto|legacy|2026-07-28 \
        [--tool NAME --good JSON --bad JSON]
    python3 mcp_python_client.py --stdio '["carapace", "mcp-stdio", ...]' ...

Lists the tools, makes a good call, a call with bad arguments (by default to the memory app's
`memory.append`) and a call to an unknown tool over the Unix socket, and prints one JSON object
with what it saw. With `--stdio` the SDK starts that command and speaks MCP over its stdio. Exits 1 when the SDK
reports anything unexpected (carapace's integration test checks the details).
"""

import argparse
import asyncio
import json
import sys

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


async def run(target, mode: str, tool: str, good_args: dict, bad_args: dict) -> dict:
    if isinstance(target, list):
        transport = StdioServerParameters(command=target[0], args=target[1:])
    else:
        http = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=target), timeout=30)
        transport = streamable_http_client("http://localhost/mcp", http_client=http)
    seen = {"mode": mode}
    async with Client(transport, mode=mode) as client:
        seen["protocol_version"] = getattr(client, "protocol_version", None)
        tools = await client.list_tools()
        seen["tools"] = sorted(t.name for t in tools.tools)
        good = await client.call_tool(tool, good_args)
        seen["good"] = {
            "is_error": bool(good.is_error),
            "structured": good.structured_content,
            "text": [c.text for c in good.content if getattr(c, "type", "") == "text"],
        }
        bad = await client.call_tool(tool, bad_args)
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
    ap.add_argument("--uds")
    ap.add_argument("--stdio", help="a JSON list: the command to start")
    ap.add_argument("--mode", default="auto")
    ap.add_argument("--tool", default="memory.append")
    ap.add_argument("--good")
    ap.add_argument("--bad", default='{"text": 5}')
    a = ap.parse_args()
    good = json.loads(a.good) if a.good else {"text": f"from python ({a.mode})"}
    target = json.loads(a.stdio) if a.stdio else a.uds
    seen = asyncio.run(run(target, a.mode, a.tool, good, json.loads(a.bad)))
    print(json.dumps(seen))
    ok = (
        a.tool in seen["tools"]
        and not seen["good"]["is_error"]
        and seen["bad"]["is_error"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
