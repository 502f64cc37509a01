"""An independent check of a carapace receipt: Ed25519 (`cryptography`) over the RFC 8785
form (`rfc8785`) for `v1`, over the batch's size and RFC 9162 Merkle root (recomputed here
from the inclusion proof) for `v2`, and the input and output hashes recomputed from the call.

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


def node(left, right):
    return hashlib.sha256(b"\x01" + left + right).digest()


def batch_root(payload, proof):
    """RFC 9162 section 2.1.3.2: the root an inclusion proof leads to, or None."""
    if len(proof) < 8 or (len(proof) - 8) % 32:
        return None
    index, size = int.from_bytes(proof[:4], "big"), int.from_bytes(proof[4:8], "big")
    path = [proof[i:i + 32] for i in range(8, len(proof), 32)]
    if index >= size:
        return None
    fn, sn = index, size - 1
    r = hashlib.sha256(b"\x00" + payload).digest()
    for p in path:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            r = node(p, r)
            while not fn & 1 and fn:
                fn >>= 1
                sn >>= 1
        else:
            r = node(r, p)
        fn >>= 1
        sn >>= 1
    if sn:
        return None
    return b"carapace receipt batch\x00" + size.to_bytes(8, "big") + r


def check(doc):
    parts = doc["receipt"].split(".")
    if parts[0] == "v1" and len(parts) == 3:
        payload, sig = b64url(parts[1]), b64url(parts[2])
        signed = payload
    elif parts[0] == "v2" and len(parts) == 4:
        payload, sig = b64url(parts[1]), b64url(parts[3])
        signed = batch_root(payload, b64url(parts[2]))
        if signed is None:
            return "proof"
    else:
        return "form"
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(doc["public_key"]))
    try:
        key.verify(sig, signed)
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
