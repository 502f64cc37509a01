"""An independent RFC 9421 signer (PyPI `http-message-signatures`) for carapace's
`http_signature` fronts.

    python3 httpsig_sign.py keygen PEM           # an Ed25519 key: writes PEM, prints the public key (base64)
    python3 httpsig_sign.py sign --url URL --body-file F --key-id ID --alg hmac-sha256|ed25519
        --key-file F [--created UNIX] [--nonce N] [--cover a,b,...] [--header NAME=VALUE ...]

`sign` prints one JSON object: the headers to send (Signature-Input, Signature,
Content-Digest and the given ones). The key never appears in the output.
"""

import argparse
import base64
import datetime
import json
import sys

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from http_message_signatures import HTTPMessageSigner, MappingKeyResolver, algorithms


def keygen(path: str) -> None:
    key = Ed25519PrivateKey.generate()
    with open(path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    print(base64.b64encode(raw).decode())


def sign(a) -> None:
    with open(a.key_file, "rb") as f:
        material = f.read()
    if a.alg == "hmac-sha256":
        algorithm, key = algorithms.HMAC_SHA256, material
    else:
        algorithm, key = algorithms.ED25519, serialization.load_pem_private_key(material, None)
    with open(a.body_file, "rb") as f:
        body = f.read()
    headers = dict(h.split("=", 1) for h in a.header)
    request = requests.Request("POST", a.url, data=body, headers=headers).prepare()
    signer = HTTPMessageSigner(signature_algorithm=algorithm,
                               key_resolver=MappingKeyResolver(public_keys={}, private_keys={a.key_id: key}))
    created = datetime.datetime.fromtimestamp(a.created, datetime.timezone.utc) if a.created else None
    signer.sign(request, key_id=a.key_id, created=created, nonce=a.nonce, label="sig1",
                covered_component_ids=tuple(a.cover.split(",")), body=body)
    out = {k: v for k, v in request.headers.items() if k.lower() not in ("content-length",)}
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keygen")
    k.add_argument("pem")
    s = sub.add_parser("sign")
    s.add_argument("--url", required=True)
    s.add_argument("--body-file", required=True)
    s.add_argument("--key-id", required=True)
    s.add_argument("--alg", required=True, choices=["hmac-sha256", "ed25519"])
    s.add_argument("--key-file", required=True)
    s.add_argument("--created", type=int)
    s.add_argument("--nonce")
    s.add_argument("--cover", default="@method,@target-uri,content-digest")
    s.add_argument("--header", action="append", default=[])
    a = p.parse_args()
    if a.cmd == "keygen":
        keygen(a.pem)
    else:
        sign(a)


if __name__ == "__main__":
    sys.exit(main())
