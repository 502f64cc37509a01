"""Raw Streamable HTTP against carapace's MCP front: resource subscriptions in both eras.

    python3 mcp_subscriptions.py --uds PATH --uri URI [--other URI]

- 2026-07-28: `subscriptions/listen` for `--uri` and the resource list; the acknowledgment is
  read, then the `touch` tool is called (in another connection) for `--other` and then for
  `--uri`, and the notifications on the stream are read.
- 2025-11-25: `initialize`, `resources/subscribe` to `--uri`, the session's `GET` stream, the
  same two `touch` calls, and the notifications on the stream.

Prints one JSON object with what each stream carried.
"""

import argparse
import json
import queue
import sys
import threading

import httpx2

V = "2025-11-25"
MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "subscriptions-test", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def client(uds):
    return httpx2.Client(transport=httpx2.HTTPTransport(uds=uds), base_url="http://localhost", timeout=30)


def touch(uds, uri):
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "touch", "arguments": {"uri": uri}, "_meta": META},
    }
    headers = {
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
        "mcp-name": "touch",
        "accept": "application/json, text/event-stream",
    }
    with client(uds) as c:
        r = c.post("/mcp", headers=headers, json=body)
        r.raise_for_status()


def read_events(resp, out: queue.Queue):
    data = []
    for line in resp.iter_lines():
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and data:
            out.put(json.loads("\n".join(data)))
            data = []


def collect(uds, open_stream, uri, other, wanted):
    """Open the stream, touch `other` then `uri`, and gather messages until `wanted` arrived."""
    got = []
    q: queue.Queue = queue.Queue()
    with client(uds) as c, open_stream(c) as resp:
        result = {"status": resp.status_code, "content_type": resp.headers.get("content-type")}
        if resp.status_code != 200:
            result["body"] = resp.read().decode()
            return result
        threading.Thread(target=read_events, args=(resp, q), daemon=True).start()
        first = None
        if open_stream.acknowledged:
            first = q.get(timeout=10)
            result["ack"] = first
        touch(uds, other)
        touch(uds, uri)
        try:
            while len([m for m in got if m.get("method") == "notifications/resources/updated"]) < wanted:
                got.append(q.get(timeout=10))
        except queue.Empty:
            pass
    result["messages"] = got
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--uds", required=True)
    ap.add_argument("--uri", required=True)
    ap.add_argument("--other", default="notes://public/other")
    a = ap.parse_args()
    seen = {}

    def listen(c):
        body = {
            "jsonrpc": "2.0",
            "id": "sub-1",
            "method": "subscriptions/listen",
            "params": {
                "_meta": META,
                "notifications": {"resourceSubscriptions": [a.uri], "resourcesListChanged": True},
            },
        }
        headers = {
            "mcp-protocol-version": MODERN,
            "mcp-method": "subscriptions/listen",
            "accept": "application/json, text/event-stream",
        }
        return c.stream("POST", "/mcp", headers=headers, json=body)

    listen.acknowledged = True
    seen["modern"] = collect(a.uds, listen, a.uri, a.other, 1)

    with client(a.uds) as c:
        init = c.post(
            "/mcp",
            headers={"accept": "application/json, text/event-stream"},
            json={
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {"protocolVersion": V, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
            },
        )
        sid = init.headers["mcp-session-id"]
        seen["capabilities"] = init.json()["result"]["capabilities"]
        h = {"mcp-session-id": sid, "mcp-protocol-version": V}
        c.post("/mcp", headers=h, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        sub = c.post(
            "/mcp",
            headers=h,
            json={"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe", "params": {"uri": a.uri}},
        )
        seen["subscribe"] = sub.json()

        def get(c2):
            return c2.stream("GET", "/mcp", headers={**h, "accept": "text/event-stream"})

        get.acknowledged = False
        seen["legacy"] = collect(a.uds, get, a.uri, a.other, 1)
        unsub = c.post(
            "/mcp",
            headers=h,
            json={"jsonrpc": "2.0", "id": 2, "method": "resources/unsubscribe", "params": {"uri": a.uri}},
        )
        seen["unsubscribe"] = unsub.json()
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
