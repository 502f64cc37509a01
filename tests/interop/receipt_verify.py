"""An independent check of a carapace receipt: Ed25519 (`cryptography`) over the RFC 8785
form (`rfc8785`), and the input and output hashes recomputed from the call.

Reads one JSON object on stdin:
  {"receipt": "<Carapace-Receipt value>", "public_key": "<base64 Ed25519 key>",
   "args": {...}, "status": "ok"|"error"|"timeout", "output": ..., "code": "..."}
Prints {"valid": true, "receipt": {...}} or {"valid": false, "reason": "..."}.
"""

import base64
import hashlib
import json
import sys

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


def b64url(s):
    if "=" in s:
        raise ValueError("padded base64url")
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def tag(value):
    return "sha256:" + hashlib.sha256(rfc8785.dumps(value)).hexdigest()


def check(doc):
    parts = doc["receipt"].split(".")
    if len(parts) != 3 or parts[0] != "v1":
        return "form"
    payload, sig = b64url(parts[1]), b64url(parts[2])
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(doc["public_key"]))
    try:
        key.verify(sig, payload)
    except InvalidSignature:
        return "signature"
    receipt = json.loads(payload)
    if rfc8785.dumps(receipt) != payload:
        return "not_canonical"
    fields = {"receipt_id", "tool", "consumer", "provider", "input_hash", "output_hash",
              "status", "executed_at", "duration_ms"}
    if set(receipt) != fields:
        return "fields"
    if receipt["input_hash"] != tag(doc["args"]):
        return "input_hash"
    status = doc["status"]
    if receipt["status"] != status:
        return "status"
    output = {"ok": doc.get("output"), "error": {"code": doc.get("code")}, "timeout": None}[status]
    if receipt["output_hash"] != tag(output):
        return "output_hash"
    return receipt


def main():
    doc = json.load(sys.stdin)
    got = check(doc)
    if isinstance(got, str):
        print(json.dumps({"valid": False, "reason": got}))
    else:
        print(json.dumps({"valid": True, "receipt": got}))


if __name__ == "__main__":
    main()
