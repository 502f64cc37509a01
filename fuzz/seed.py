#!/usr/bin/env python3
"""Regenerate the seed corpora of the fuzz targets (fuzz/corpus/<target>/) from the protocol
vectors (../shared/vectors/ beside this checkout) and the example configurations.

Usage: python3 fuzz/seed.py [VECTORS_DIR]

Each seed is one file named by the SHA-1 of its bytes (as libFuzzer names corpus entries), so
running the script twice gives the same files. The seeds written before are removed first;
regression inputs kept beside them (`crash-*`) stay.
"""

import hashlib
import json
import sys
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
ROOT = FUZZ.parent
VECTORS = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "vectors"
CORPUS = FUZZ / "corpus"

# app_responses: the first byte picks the decoder, the second the HTTP status (index into the
# target's STATUSES: 0 is 200, 4 is 400, 6 is 500).
TOOLS_V1_RESPONSE, SKILL_RUN_RESPONSE, TOOLS_V1_DISCOVERY, SKILL_MANIFEST = range(4)
STATUS_INDEX = {200: 0, 201: 1, 204: 2, 302: 3, 400: 4, 404: 5, 500: 6, 503: 7}


def load(rel):
    return json.loads((VECTORS / rel).read_text(encoding="utf-8"))


def tools_v1_request():
    for case in load("crabstack/toolhost_http.json")["cases"]:
        if case["path"] == "/v1/tools/call" and case["method"] == "POST":
            yield case.get("request_body", "")


def skill_v1_request():
    for v in load("vagus/canonical_hmac_vectors.json")["vectors"]:
        yield v["wire_body"]


def canonical_hmac():
    for v in load("vagus/canonical_hmac_vectors.json")["vectors"]:
        yield v["wire_body"]
        yield v["canonical"]


def pairing_wire():
    for line in (VECTORS / "crabstack/pairing_transcript.jsonl").read_text().splitlines():
        frame = json.loads(line)
        if frame.get("kind") == "ws" and frame.get("text"):
            yield frame["text"]
    negative = load("crabstack/pairing_negative.json")
    for v in negative["vectors"] + negative["accepted_variants"]["vectors"]:
        yield v["wire_text"]


FP = "sha256:cb7fcdc361abd781db9c3bb64306d58140bdafd6a9ccfca45f465f5261169cdf"
CA = "sha256:" + "ab" * 32


def peer_store():
    # The README's example, then one record of each kind the store knows.
    gateway = {
        "component_type": "gateway", "component_id": "gw_home", "role": "gateway",
        "endpoint": None, "public_key_ed25519": None, "public_key_x25519": None,
        "mtls_cert_fingerprint": FP, "status": "active", "paired_at": "2026-11-21T10:00:00Z",
        "last_seen_at": None, "policy": None,
    }
    yield json.dumps({"version": 1, "peers": [gateway]}, indent=2)
    yield json.dumps({"version": 1, "peers": []})
    yield json.dumps({"version": 0})
    yield json.dumps({"version": 1, "peers": [
        dict(gateway, mtls_cert_not_after="2027-11-21T10:00:00.123456789+02:00",
             last_seen_at="2026-11-22T08:30:00Z"),
        {"component_type": "gateway", "component_id": "gw_ca", "mtls_ca_fingerprint": CA,
         "status": "active"},
        {"component_type": "tool_host", "component_id": "th1",
         "mtls_cert_fingerprint": "SHA256:" + "0F" * 32, "status": "revoked"},
        {"component_type": "operator", "component_id": "op", "role": "cli_admin",
         "mtls_cert_fingerprint": "sha256:" + "01" * 32, "status": "pending",
         "policy": {"allow": ["tools.call:memory.*"], "deny": ["tools.call:memory.delete"],
                    "leases": [{"allow": ["tools.call:*"], "deny": ["admin.*"],
                                "expires_at_ms": 1767225600000}]}},
    ]})


def config():
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        yield path.read_text(encoding="utf-8")


def app_responses():
    def framed(which, status, body):
        return bytes([which, STATUS_INDEX.get(status, STATUS_INDEX[400])]) + body.encode()

    for case in load("crabstack/toolhost_http.json")["cases"]:
        if case["path"] == "/v1/tools/call" and case.get("response_body"):
            yield framed(TOOLS_V1_RESPONSE, case["status"], case["response_body"])
        if case["id"] == "discovery":
            yield framed(TOOLS_V1_DISCOVERY, 200, case["response_body"])
    # `/run` answers the Vagus harness captured, and the demo server's error bodies.
    seen = set()
    for path in sorted((VECTORS / "vagus/captured").glob("*.json")):
        for call in json.loads(path.read_text()).get("calls", []):
            result = call.get("result")
            if isinstance(result, dict):
                result = {k: v for k, v in result.items() if not k.startswith("__")}
                text = json.dumps(result, ensure_ascii=False, separators=(",", ":"))
                if text not in seen:
                    seen.add(text)
                    yield framed(SKILL_RUN_RESPONSE, 200, text)
    wire = load("vagus/wire_contract.json")
    for key, body in wire["demo_server_error_bodies"].items():
        if isinstance(body, dict):
            status = int(key.split("_")[0])
            yield framed(SKILL_RUN_RESPONSE, status if status in STATUS_INDEX else 400,
                         json.dumps(body))
    manifest = wire["discovery"]["example_manifest_demo_server"]
    yield framed(SKILL_MANIFEST, 200, json.dumps(manifest))
    # The protocol text's shape: capabilities as strings, schemas at the top.
    caps = manifest["capabilities"]
    text_shape = {k: v for k, v in manifest.items() if k != "capabilities"}
    text_shape.update(capabilities=[c["capability"] for c in caps],
                      input_schema=caps[0]["input_schema"],
                      output_schema=caps[0]["output_schema"])
    yield framed(SKILL_MANIFEST, 200, json.dumps(text_shape))


def mcp_request():
    """The flags byte (see the target), then a body: the EAT vectors' JSON-RPC cases (in a
    2025-03-26 session) and 2026-07-28 requests with their headers."""
    session, modern = 0x08, 0x01 | 0x02 | 0x04
    for case in load("eat/upstream/examples/test-vectors/mcp_test_vectors.json"):
        data = case["test_data"]
        msg = data.get("request", data.get("response"))
        yield bytes([session]) + json.dumps(msg).encode()
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    for method, params in [
        ("server/discover", {}),
        ("tools/list", {}),
        ("tools/list", {"cursor": "ZGVtby5lY2hv"}),
        ("tools/call", {"name": "demo.echo", "arguments": {"text": "hi"}}),
        ("ping", {}),
    ]:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
        yield bytes([modern]) + json.dumps(body).encode()
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}}}
    yield bytes([0]) + json.dumps(init).encode()
    yield bytes([0x10 | session])


def b64url(obj):
    import base64
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def bearer_token():
    """JWS compact tokens (headers of every accepted and some refused algorithms) and claims."""
    claims = {"iss": "https://auth.test", "aud": "https://tools.test/mcp", "sub": "alice",
              "scope": "tools tools:read", "iat": 1799999990, "exp": 1800000300}
    yield json.dumps(claims)
    yield json.dumps(dict(claims, aud=["https://TOOLS.test/mcp/", "x"], scp=["a", "b"]))
    for header in ({"alg": "ES256", "kid": "ec"}, {"alg": "EdDSA", "kid": "ed"}, {"alg": "RS256", "kid": "rsa"},
                   {"alg": "RS256"}, {"alg": "none"}, {"alg": "HS256", "kid": "ec"},
                   {"alg": "ES256", "crit": ["exp"]}):
        yield f"{b64url(header)}.{b64url(claims)}.c2lnbmF0dXJl"


def www_authenticate():
    yield 'Bearer resource_metadata="https://tools.test/.well-known/oauth-protected-resource/mcp", scope="tools:read"'
    yield 'Bearer error="insufficient_scope", scope="tools", error_description="tool.call:x needs \\"tools\\""'
    yield 'Basic realm="a, b", Bearer error=invalid_token, Negotiate abc=='
    yield "needs the scope tools\ntools tools:read"


def http_signature():
    """The README's signed request: Signature-Input, Signature, Content-Digest and body."""
    body = b'{"version":"v1","call_id":"c-1","tool_name":"memory.query","tenant_id":"t","args":{"query":"x"}}'
    parts = [
        b'sig1=("@method" "@target-uri" "content-digest");created=1795000000;keyid="k1";alg="hmac-sha256";nonce="6f1c2a9e4b7d8a03"',
        b"sig1=:VUc4rmyI6M/PTsRr7pSzaQTDfs4dS9riyh0rbUGYXr8=:",
        b"sha-256=:wf7ChwqwWCzLc6rQp0MuixbV8exg6lt0wARDLV5JEd0=:",
        body,
    ]
    yield b"\xff".join(parts)
    yield b"\xff".join([
        b'a=("@authority" "@path" "@query" "@request-target" "content-type");created=1;nonce="n";keyid="k";expires=2;tag="t", b=("date");created=1',
        b"a=:AAAA:, b=:AAAA:",
        b"sha-512=:AAAA:, sha-256=:AAAA:, md5=:AAAA:",
        b"",
    ])


def secret_guard():
    yield json.dumps({"key": "AKIAIOSFODNN7EXAMPLE", "nested": ["Bearer abcdefghijklmnopqrstuvwx", {"v": "s3cr3t-value"}]})
    yield "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
    yield json.dumps({"jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlc2lnbmF0dXJl", "t": "tok_abcd1234"})


def eat_catalog():
    """Every catalog of the EAT vectors, as bytes (the cases' test_data, and the files)."""
    cases = load("eat/upstream/examples/test-vectors/invalid_catalogs.json")
    cases.append(load("eat/upstream/examples/test-vectors/valid_catalog.json"))
    for case in cases:
        data = case["test_data"]
        yield data if isinstance(data, str) else json.dumps(data)
    for rel in ("examples/catalogs/simple-catalog.json", "examples/catalogs/enterprise-catalog.json",
                "examples/catalogs/signed-catalog.json", "tests/fixtures/catalogs/invalid_catalog.json"):
        yield (VECTORS / "eat" / "upstream" / rel).read_bytes()


def eat_jws():
    """Catalog signatures (accepted and refused headers), JWKs, and tool names."""
    claims = {"iss": "did:web:tools.test%3A8443", "iat": 1800000000, "exp": 1800003600,
              "catalog_hash": "sha256:" + "ab" * 32}
    for header in ({"alg": "RS256", "typ": "JWS", "kid": "k1"}, {"alg": "RS256", "kid": "k1"},
                   {"alg": "none", "kid": "k1"}, {"alg": "HS256", "kid": "k1"},
                   {"alg": "RS256", "kid": "k1", "crit": ["exp"]}):
        yield f"{b64url(header)}.{b64url(claims)}.c2lnbmF0dXJl"
    import base64
    n = base64.urlsafe_b64encode(b"\xc5" * 256).rstrip(b"=").decode()
    yield json.dumps({"kty": "RSA", "kid": "k1", "alg": "RS256", "use": "sig", "n": n, "e": "AQAB"})
    yield json.dumps({"kty": "RSA", "n": n[:100], "e": "AQAB"})
    for name in ("memory.query", "memory-2equery", "a--b", "-c3-a9t", "\u00e9t\u00e9"):
        yield name


def eat_openapi():
    """A tool's OpenAPI document as carapace serves it, and the EAT repository's specs."""
    yield json.dumps({"openapi": "3.1.0", "info": {"title": "memory.query", "version": "0.0.0"},
                      "paths": {"/tools/memory-2equery": {"post": {
                          "operationId": "memory.query",
                          "requestBody": {"required": True, "content": {"application/json": {
                              "schema": {"type": "object", "required": ["query"],
                                         "properties": {"query": {"type": "string"}}}}}},
                          "responses": {"200": {"description": "r", "content": {"application/json": {
                              "schema": {"type": "object"}}}}},
                          "x-mcp-tool": {"server_url": "https://tools.test/mcp"}}}}})
    yield json.dumps({"openapi": "3.0.0", "paths": {"/a": {"get": {"operationId": "a"},
                                                           "post": {"operationId": "b"}}}})


def caller_tools():
    """Declarations from the relay text's scenarios, and answers."""
    yield json.dumps({"caller_id": "myapp", "tools": [
        {"name": "send_notification", "description": "Send notification",
         "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}}}]})
    yield json.dumps({"tools": [{"name": "a"}, {"name": "a"}]})
    yield json.dumps({"caller_id": "my app", "tools": [{"name": "x", "inputSchema": {"type": "nonsense"}}]})
    yield json.dumps({"stream_id": "ab" * 16, "request_id": "cd" * 16, "result": {"status": "sent"}})
    yield json.dumps({"stream_id": "ab" * 16, "request_id": "cd" * 16, "error": "recipient not found"})


def receipt():
    """Receipts signed as carapace signs them, and near misses."""
    import base64
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    key = Ed25519PrivateKey.from_private_bytes(bytes([7]) * 32)
    body = {"consumer": "gw_home", "duration_ms": 4, "executed_at": "2026-11-26T12:00:00.123Z",
            "input_hash": "sha256:" + "ab" * 32, "output_hash": "sha256:" + "cd" * 32,
            "provider": "memory-east", "receipt_id": "rcpt_" + "01" * 12, "status": "ok",
            "tool": "memory.query"}

    def enc(raw):
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    for status in ["ok", "error", "timeout"]:
        raw = json.dumps({**body, "status": status}, separators=(",", ":"), sort_keys=True).encode()
        yield "v1." + enc(raw) + "." + enc(key.sign(raw))
    pretty = json.dumps(body, indent=1).encode()
    yield "v1." + enc(pretty) + "." + enc(key.sign(pretty))
    yield "v1.e30." + enc(bytes(64))
    # v2: a batch of two (RFC 9162 leaves and root), then a proof that is too short and one
    # whose index is past its size.
    import hashlib as h
    raws = [json.dumps({**body, "receipt_id": "rcpt_" + f"{i:02x}" * 12}, separators=(",", ":"),
                       sort_keys=True).encode() for i in range(2)]
    leaves = [h.sha256(b"\0" + r).digest() for r in raws]
    root = h.sha256(b"\1" + leaves[0] + leaves[1]).digest()
    sig = key.sign(b"carapace receipt batch\0" + (2).to_bytes(8, "big") + root)
    for i, raw in enumerate(raws):
        proof = i.to_bytes(4, "big") + (2).to_bytes(4, "big") + leaves[1 - i]
        yield "v2." + enc(raw) + "." + enc(proof) + "." + enc(sig)
    yield "v2." + enc(raws[0]) + "." + enc(bytes(7)) + "." + enc(sig)
    yield "v2." + enc(raws[0]) + "." + enc((5).to_bytes(4, "big") + (2).to_bytes(4, "big")) + "." + enc(sig)


def app_answer():
    # The first byte is the read size (0: whole), the second the body bound in units of 16.
    answers = [
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n"
        b'{"ok":true}',
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nx-trailer: 1\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nconnection: close\r\n\r\nto the end",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\nconnection: close\r\n\r\nfail",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
    ]
    for i, answer in enumerate(answers):
        yield bytes([i % 3 * 5, 8]) + answer


TARGETS = {
    "tools_v1_request": tools_v1_request,
    "skill_v1_request": skill_v1_request,
    "canonical_hmac": canonical_hmac,
    "pairing_wire": pairing_wire,
    "peer_store": peer_store,
    "config": config,
    "app_responses": app_responses,
    "mcp_request": mcp_request,
    "bearer_token": bearer_token,
    "www_authenticate": www_authenticate,
    "http_signature": http_signature,
    "secret_guard": secret_guard,
    "eat_catalog": eat_catalog,
    "eat_jws": eat_jws,
    "eat_openapi": eat_openapi,
    "caller_tools": caller_tools,
    "receipt": receipt,
    "app_answer": app_answer,
}


def main():
    total = 0
    for target, seeds in TARGETS.items():
        out = CORPUS / target
        # Regression inputs kept beside the seeds (crash-*, named by libFuzzer) stay.
        out.mkdir(parents=True, exist_ok=True)
        for old in out.iterdir():
            if len(old.name) == 40 and all(c in "0123456789abcdef" for c in old.name):
                old.unlink()
        for seed in seeds():
            data = seed if isinstance(seed, bytes) else seed.encode("utf-8")
            (out / hashlib.sha1(data).hexdigest()).write_bytes(data)
        files = list(out.iterdir())
        size = sum(f.stat().st_size for f in files)
        total += size
        print(f"{target}: {len(files)} files, {size} bytes")
    print(f"total: {total} bytes")


if __name__ == "__main__":
    main()
