"""The official Python MCP SDK as a client of carapace's MCP front, for what the server says to
the caller while a call runs: it answers elicitation (in every era) and records progress and
log messages.

    python3 mcp_python_relay_client.py --uds PATH --mode 2026-07-28|legacy [--decline]

Calls `confirm {"item": "x"}` (the server asks the user to confirm) and `count {"n": 3}`
(progress and log messages), and prints one JSON object with what it saw.
"""

import argparse
import asyncio
import json
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitResult


async def run(uds: str, mode: str, accept: bool) -> dict:
    seen: dict = {"mode": mode, "asked": [], "logs": []}

    async def elicit(context, params):
        seen["asked"].append(params.message)
        return ElicitResult(action="accept", content={"ok": accept})

    async def log(params):
        seen["logs"].append([params.level, params.data])

    http = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=uds), timeout=30)
    transport = streamable_http_client("http://localhost/mcp", http_client=http)
    # Log messages: a 2026-07-28 request opts in with a level; an older session sets one.
    level = "debug" if mode == "2026-07-28" else None
    async with Client(
        transport,
        mode=mode,
        elicitation_callback=elicit,
        logging_callback=log,
        log_level=level,
    ) as client:
        seen["protocol_version"] = getattr(client, "protocol_version", None)
        if mode != "2026-07-28":
            await client.set_logging_level("warning")
        confirm = await client.call_tool("confirm", {"item": "x"})
        seen["confirm"] = {
            "is_error": bool(confirm.is_error),
            "text": [c.text for c in confirm.content if getattr(c, "type", "") == "text"],
        }
        progress = []

        async def on_progress(p, total, message):
            progress.append([p, total, message])

        count = await client.call_tool("count", {"n": 3}, progress_callback=on_progress)
        seen["count"] = [c.text for c in count.content if getattr(c, "type", "") == "text"]
        seen["progress"] = progress
    return seen


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--uds", required=True)
    ap.add_argument("--mode", default="auto")
    ap.add_argument("--decline", action="store_true")
    a = ap.parse_args()
    print(json.dumps(asyncio.run(run(a.uds, a.mode, not a.decline))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
