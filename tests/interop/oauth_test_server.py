"""A small OAuth 2.1 authorization server for tests: RFC 8414 metadata, dynamic client
registration (RFC 7591), the authorization-code grant with PKCE (S256, approved at once, no
user), and RS256 JWT access tokens whose `aud` is the `resource` the client asked for
(RFC 8707), with the JWKS at /jwks.

    python3 oauth_test_server.py [--grant SCOPE=...]

Prints its issuer URL on the first line of stdout, then serves on 127.0.0.1 until killed.
Every scope asked for is granted. Tokens are never printed.
"""

import base64
import hashlib
import json
import secrets
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
KID = "test-" + secrets.token_hex(4)


def b64(n: int) -> str:
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


NUMBERS = KEY.public_key().public_numbers()
JWKS = {"keys": [{"kty": "RSA", "kid": KID, "use": "sig", "alg": "RS256", "n": b64(NUMBERS.n), "e": b64(NUMBERS.e)}]}
CLIENTS: dict = {}
CODES: dict = {}


class Handler(BaseHTTPRequestHandler):
    issuer = ""

    def log_message(self, *args):
        pass

    def answer(self, status: int, body=None, headers=None):
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/.well-known/oauth-authorization-server":
            i = self.issuer
            return self.answer(200, {
                "issuer": i,
                "authorization_endpoint": f"{i}/authorize",
                "token_endpoint": f"{i}/token",
                "registration_endpoint": f"{i}/register",
                "jwks_uri": f"{i}/jwks",
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["none"],
                "authorization_response_iss_parameter_supported": True,
            })
        if url.path == "/jwks":
            return self.answer(200, JWKS)
        if url.path == "/authorize":
            q = dict(urllib.parse.parse_qsl(url.query))
            if q.get("client_id") not in CLIENTS or q.get("code_challenge_method") != "S256":
                return self.answer(400, {"error": "invalid_request"})
            code = secrets.token_urlsafe(24)
            CODES[code] = q
            target = q["redirect_uri"] + "?" + urllib.parse.urlencode(
                {"code": code, "state": q.get("state", ""), "iss": self.issuer})
            return self.answer(302, None, {"Location": target})
        self.answer(404, {"error": "not_found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        if self.path == "/register":
            meta = json.loads(raw)
            client_id = "client-" + secrets.token_hex(6)
            info = dict(meta, client_id=client_id, client_id_issued_at=int(time.time()),
                        token_endpoint_auth_method="none")
            CLIENTS[client_id] = info
            return self.answer(201, info)
        if self.path == "/token":
            form = dict(urllib.parse.parse_qsl(raw.decode()))
            q = CODES.pop(form.get("code", ""), None)
            if form.get("grant_type") != "authorization_code" or q is None:
                return self.answer(400, {"error": "invalid_grant"})
            challenge = base64.urlsafe_b64encode(
                hashlib.sha256(form.get("code_verifier", "").encode()).digest()).rstrip(b"=").decode()
            if challenge != q["code_challenge"] or form.get("client_id") != q["client_id"]:
                return self.answer(400, {"error": "invalid_grant"})
            now = int(time.time())
            scope = q.get("scope", "")
            claims = {"iss": self.issuer, "sub": "user-" + q["client_id"], "client_id": q["client_id"],
                      "aud": q.get("resource", ""), "scope": scope, "iat": now, "exp": now + 600}
            token = jwt.encode(claims, KEY, algorithm="RS256", headers={"kid": KID})
            return self.answer(200, {"access_token": token, "token_type": "Bearer",
                                     "expires_in": 600, "scope": scope})
        self.answer(404, {"error": "not_found"})


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Handler.issuer = f"http://127.0.0.1:{server.server_address[1]}"
    print(Handler.issuer, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
