"""A stdio MCP server (2025-11-25, JSON lines, no SDK) whose tools can change under it, for
the pinning tests: the tool definitions are read from the JSON file named by TOOLS_FILE at
every `tools/list`, and when the file changes the server sends
`notifications/tools/list_changed`. `tools/call` answers "called NAME".

With NOTICES=N it also sends N `list_changed` notices 5 ms apart after its first
`tools/list` (a server flooding its client), and with LISTS_FILE it appends a line to that
file for every `tools/list` it answers.
"""

import json
import os
import sys
import threading
import time

PATH = os.environ["TOOLS_FILE"]
NOTICES = int(os.environ.get("NOTICES", "0"))
LISTS_FILE = os.environ.get("LISTS_FILE")
lock = threading.Lock()


def send(msg):
    with lock:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


def tools():
    with open(PATH) as f:
        return json.load(f)


def watch():
    seen = os.stat(PATH).st_mtime_ns
    while True:
        time.sleep(0.05)
        now = os.stat(PATH).st_mtime_ns
        if now != seen:
            seen = now
            send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})


def flood():
    for _ in range(NOTICES):
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        time.sleep(0.005)


def main():
    threading.Thread(target=watch, daemon=True).start()
    flooded = False
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        method, mid = msg.get("method"), msg.get("id")
        if mid is None:
            continue
        if method == "initialize":
            result = {"protocolVersion": "2025-11-25",
                      "capabilities": {"tools": {"listChanged": True}},
                      "serverInfo": {"name": "shifty", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": tools()}
            if LISTS_FILE:
                with open(LISTS_FILE, "a") as f:
                    f.write("list\n")
            if NOTICES and not flooded:
                flooded = True
                threading.Thread(target=flood, daemon=True).start()
        elif method == "tools/call":
            name = msg["params"]["name"]
            result = {"content": [{"type": "text", "text": f"called {name}"}]}
        else:
            send({"jsonrpc": "2.0", "id": mid,
                  "error": {"code": -32601, "message": f"no {method}"}})
            continue
        send({"jsonrpc": "2.0", "id": mid, "result": result})


if __name__ == "__main__":
    main()
