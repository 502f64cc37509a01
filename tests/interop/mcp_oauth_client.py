"""The official Python MCP SDK as an OAuth client of carapace's MCP front: its
`OAuthClientProvider` finds the authorization server from carapace's 401 challenge and
protected-resource metadata, registers, runs the authorization-code grant with PKCE against
`oauth_test_server.py`, and calls with the token. A call the first token's scope does not
allow is answered 403 `insufficient_scope`; the SDK asks for the scope named and retries.

    python3 mcp_oauth_client.py --url https://127.0.0.1:PORT/mcp --ca CA.pem --mode 2026-07-28|legacy

Prints one JSON object: the tools listed, the two call results and the scopes asked for.
"""

import argparse
import asyncio
import json
import ssl
import urllib.parse

import httpx2
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken


class Memory:
    def __init__(self):
        self.tokens = None
        self.client = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


async def run(url: str, ca: str, mode: str) -> dict:
    seen: dict = {"asked": []}
    redirect: dict = {}

    async def on_redirect(authorization_url: str) -> None:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(authorization_url).query))
        seen["asked"].append({"scope": query.get("scope"), "resource": query.get("resource")})
        async with httpx2.AsyncClient(timeout=10) as browser:
            r = await browser.get(authorization_url, follow_redirects=False)
        location = urllib.parse.urlsplit(r.headers["location"])
        redirect.update(dict(urllib.parse.parse_qsl(location.query)))

    async def on_callback() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(code=redirect["code"], state=redirect.get("state"), iss=redirect.get("iss"))

    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="carapace interop",
            redirect_uris=["http://127.0.0.1:9/callback"],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=Memory(),
        redirect_handler=on_redirect,
        callback_handler=on_callback,
    )
    tls = ssl.create_default_context(cafile=ca)
    http = httpx2.AsyncClient(auth=provider, verify=tls, timeout=30)
    async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        seen["protocol_version"] = getattr(client, "protocol_version", None)
        tools = await client.list_tools()
        seen["tools"] = sorted(t.name for t in tools.tools)
        query = await client.call_tool("memory.query", {"query": "x"})
        seen["query"] = {"is_error": bool(query.is_error)}
        append = await client.call_tool("memory.append", {"text": "from oauth"})
        seen["append"] = {
            "is_error": bool(append.is_error),
            "structured": append.structured_content,
        }
    return seen


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--mode", default="2026-07-28")
    a = p.parse_args()
    print(json.dumps(asyncio.run(run(a.url, a.ca, a.mode))))


if __name__ == "__main__":
    main()
