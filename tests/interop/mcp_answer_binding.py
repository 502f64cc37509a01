"""Raw Streamable HTTP against carapace's MCP front: who may answer a request the MCP server put
to a caller (older era).

    python3 mcp_answer_binding.py --uds PATH

Session A calls `confirm` and takes the SSE answer; when the server's `elicitation/create`
arrives on it, session B posts an answer with the same id (it must be refused), A posts one
with an id it was never sent (refused), then A answers for real (accepted) and the call ends
with the server's result. Prints one JSON object with what it saw.
"""

import argparse
import json
import sys

import httpx2

V = "2025-11-25"


def initialize(http, capabilities):
    r = http.post(
        "/mcp",
        headers={"accept": "application/json, text/event-stream"},
        json={
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": V,
                "capabilities": capabilities,
                "clientInfo": {"name": "binding-test", "version": "1"},
            },
        },
    )
    r.raise_for_status()
    sid = r.headers["mcp-session-id"]
    http.post(
        "/mcp",
        headers={"mcp-session-id": sid, "mcp-protocol-version": V},
        json={"jsonrpc": "2.0", "method": "notifications/initialized"},
    )
    return sid


def answer(http, sid, rid, ok):
    r = http.post(
        "/mcp",
        headers={"mcp-session-id": sid, "mcp-protocol-version": V},
        json={"jsonrpc": "2.0", "id": rid, "result": {"action": "accept", "content": {"ok": ok}}},
    )
    return {"status": r.status_code, "body": r.json() if r.content else None}


def events(lines):
    data = []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and data:
            yield json.loads("\n".join(data))
            data = []


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--uds", required=True)
    a = ap.parse_args()
    transport = httpx2.HTTPTransport(uds=a.uds)
    seen = {}
    with httpx2.Client(transport=transport, base_url="http://localhost", timeout=30) as http, \
            httpx2.Client(transport=httpx2.HTTPTransport(uds=a.uds), base_url="http://localhost", timeout=30) as other:
        sid_a = initialize(http, {"elicitation": {}})
        sid_b = initialize(other, {"elicitation": {}})
        call = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "confirm", "arguments": {"item": "x"}},
        }
        headers = {
            "mcp-session-id": sid_a,
            "mcp-protocol-version": V,
            "accept": "application/json, text/event-stream",
        }
        with httpx2.Client(transport=httpx2.HTTPTransport(uds=a.uds), base_url="http://localhost", timeout=30) as streaming:
            with streaming.stream("POST", "/mcp", headers=headers, json=call) as resp:
                seen["content_type"] = resp.headers.get("content-type")
                for msg in events(resp.iter_lines()):
                    if msg.get("method") == "elicitation/create":
                        rid = msg["id"]
                        seen["request"] = {"id_is_string": isinstance(rid, str), "method": msg["method"]}
                        seen["foreign_session"] = answer(other, sid_b, rid, False)
                        seen["unknown_id"] = answer(http, sid_a, "carapace-guess", False)
                        seen["own"] = answer(http, sid_a, rid, True)
                        seen["again"] = answer(http, sid_a, rid, True)
                    elif msg.get("id") == 7:
                        seen["result"] = msg.get("result")
                        break
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
