"""A deliberately faulty stdio MCP server (2025-11-25, JSON lines, no SDK) for fault tests.

Tools: `ok` (answers), `slow` (never answers), `crash` (the process exits at once),
`garbage` (floods stdout and stderr with junk, then answers). Every start appends a line to
the file named by STARTS_FILE, so a test can count restarts.
"""

import json
import os
import sys

TOOLS = [
    {"name": n, "description": d, "inputSchema": {"type": "object"}}
    for n, d in [
        ("ok", "answers"),
        ("slow", "never answers"),
        ("crash", "exits"),
        ("garbage", "floods stdout and stderr, then answers"),
    ]
]


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def main():
    with open(os.environ["STARTS_FILE"], "a") as f:
        f.write("start\n")
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        method, mid = msg.get("method"), msg.get("id")
        if mid is None:
            continue
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                "serverInfo": {"name": "crashy", "version": "1"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            name = msg["params"]["name"]
            if name == "crash":
                os._exit(3)
            if name == "slow":
                continue
            if name == "garbage":
                for _ in range(2000):
                    sys.stderr.write("x" * 100 + "\n")
                sys.stdout.write("not json at all\n" * 500)
                sys.stdout.write("{" * (1 << 20) + "\n")
                sys.stdout.flush()
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "content": [{"type": "text", "text": f"{name} done"}]}})
        else:
            send({"jsonrpc": "2.0", "id": mid,
                  "error": {"code": -32601, "message": "Method not found"}})


main()
