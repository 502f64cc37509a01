"""An independent EAT catalog verifier (PyJWT + rfc8785), as the EAT text's Verification
Process says: fetch the catalog, take the JWS from X-JWS-Signature, resolve the issuer's
did:web document for the key, verify RS256, compare catalog_hash with the SHA-256 of the
catalog's RFC 8785 form, check iat/exp, then fetch each tool's OpenAPI document and compare
its spec_hash. Prints one JSON object: what it found, or the first failure.

usage: eat_verify.py CATALOG_URL --ca CA.pem [--cert C --key K]
"""

import argparse
import hashlib
import json
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import jwt
import rfc8785


class Fetcher:
    """HTTPS GETs trusting one CA, presenting a client certificate when given."""

    def __init__(self, ca, cert, key):
        self.tls = ssl.create_default_context(cafile=ca)
        if cert:
            self.tls.load_cert_chain(cert, key)

    def get(self, url):
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.tls, timeout=20) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()


def sha256_tag(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def did_web_url(did: str) -> str:
    assert did.startswith("did:web:"), did
    parts = did[len("did:web:"):].split(":")
    host = urllib.parse.unquote(parts[0])
    path = "/".join(parts[1:])
    return f"https://{host}/{path + '/' if path else '.well-known/'}did.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--ca", required=True)
    ap.add_argument("--cert")
    ap.add_argument("--key")
    a = ap.parse_args()
    s = Fetcher(a.ca, a.cert, a.key)
    status, headers, body = s.get(a.url)
    out = {"status": status}
    if status != 200:
        print(json.dumps(out))
        return
    assert headers["Content-Type"].startswith("application/json")
    token = headers["X-JWS-Signature"]
    header = jwt.get_unverified_header(token)
    assert header == {"alg": "RS256", "typ": "JWS", "kid": header["kid"]}, header
    claims = jwt.decode(token, options={"verify_signature": False})
    did = claims["iss"]
    doc = json.loads(s.get(did_web_url(did))[2])
    assert doc["id"] == did, doc["id"]
    jwk = next(
        m["publicKeyJwk"]
        for m in doc["verificationMethod"]
        if m["publicKeyJwk"].get("kid") == header["kid"] and m["controller"] == did
    )
    key = jwt.PyJWK(jwk).key
    assert key.key_size >= 2048
    claims = jwt.decode(
        token, key, algorithms=["RS256"], options={"require": ["iss", "iat", "exp"]}
    )
    now = time.time()
    assert claims["iat"] <= now + 60 and claims["exp"] > now, claims
    catalog = json.loads(body)
    canonical = rfc8785.dumps(catalog)
    assert claims["catalog_hash"] == sha256_tag(canonical), "catalog_hash"
    out["served_canonical"] = canonical == body
    specs = {}
    for tool in catalog["tools"]:
        status, _, spec = s.get(tool["spec_url"])
        assert status == 200, (tool["spec_url"], status)
        assert tool["spec_hash"] == sha256_tag(spec), tool["name"]
        op = next(iter(next(iter(json.loads(spec)["paths"].values())).values()))
        specs[tool["name"]] = op["operationId"]
    out.update(
        {
            "verified": True,
            "kid": header["kid"],
            "iss": did,
            "lifetime": claims["exp"] - claims["iat"],
            "tools": specs,
            "server_urls": sorted({t["x-mcp-tool"]["server_url"] for t in catalog["tools"]}),
            "etag": headers.get("ETag"),
            "cache_control": headers.get("Cache-Control"),
        }
    )
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the test reads the failure
        print(json.dumps({"verified": False, "error": f"{type(e).__name__}: {e}"}))
        sys.exit(0)
