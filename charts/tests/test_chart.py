"""Offline tests of the carapace Helm chart.

Every case is rendered with Helm's own engine (helm-python-sdk, no helm binary, no cluster),
linted, and every manifest is validated strictly (unknown fields are errors) against the
Kubernetes schemas of KUBE_VERSION. The rendered carapace.yaml is validated against the JSON
Schema `carapace config-schema` prints and loaded by `carapace check`.

Run from the repository: python3 -m pytest charts/tests -q
CARAPACE_BIN names the carapace binary (default: <repo>/target/debug/carapace).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

TESTS = Path(__file__).resolve().parent
CHARTS = TESTS.parent
REPO = CHARTS.parent
CHART = CHARTS / "carapace"
CONSUMER = TESTS / "fixtures" / "consumer"

KUBE_VERSION = "1.30.0"
RELEASE = "demo"
NAMESPACE = "tools"

# Paths inside the carapace container.
CONFIG_PATH = "/etc/carapace/carapace.yaml"
IDENTITY = "/etc/carapace/identity"
KEYS = "/etc/carapace/keys"
UPSTREAM = "/etc/carapace/upstream"
REDIS = "/etc/carapace/redis"
PAIRING_TLS = "/etc/carapace/pairing-tls"
STATE = "/var/lib/carapace/state"
STATE_VOLUME = "/var/lib/carapace"
RUN = "/run/carapace"

GATEWAY_KEY = "VU1WXtWqa2dQMFah3Sd01wcu+T+caKs4wthkccwXx3A="


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((CHART / "examples" / name).read_text())


# Cases: values, and what the rendered chart must show for them (written out, not derived
# from the values, so a template that drops or renames something fails).
CASES: dict[str, dict[str, Any]] = {
    "default": {
        "values": {},
        "replicas": 1,
        "app": "app",
        "front": "tools-v1",
        "app_address": "http://127.0.0.1:8080",
        "pairing": False,
        "identity_secret": f"{RELEASE}-carapace-identity",
        "secrets": {"carapace-identity": (f"{RELEASE}-carapace-identity", None)},
        "redis": None,
    },
    "memory-sidecar": {
        "values": example("memory-sidecar.yaml"),
        "replicas": 3,
        "app": "memory",
        "front": "tools-v1",
        "app_address": "http://127.0.0.1:8080",
        "pairing": True,
        "identity_secret": "memory-east-identity",
        "secrets": {
            "carapace-identity": ("memory-east-identity", None),
            "carapace-redis-password": ("carapace-redis", ["password"]),
        },
        "redis": {
            "url": "redis://redis-master.redis.svc.cluster.local:6379/0",
            "key_prefix": "carapace:memory-east:",
            "timeout_ms": 250,
            "password": {"file": f"{REDIS}/password"},
        },
    },
    "legacy-skill": {
        "values": example("legacy-skill.yaml"),
        "replicas": 1,
        "app": "skill",
        "front": "tools-v1",
        "app_address": "http://127.0.0.1:4050",
        "pairing": True,
        "identity_secret": "echo-skill-identity",
        "secrets": {
            "carapace-identity": ("echo-skill-identity", None),
            "carapace-upstream-secret": ("echo-skill-secret", ["secret"]),
        },
        "redis": None,
    },
    # A Skill Gateway v1 endpoint: callers sign each /run with rotation keys from a Secret.
    "skill-front": {
        "values": {
            "replicaCount": 2,
            "front": {
                "protocol": "skill-v1",
                "auth": {
                    "mode": "hmac",
                    "headerName": "X-Skill-Signature",
                    "existingSecret": "skill-keys",
                    "keys": ["2026-11", "2026-05"],
                    "timestampSkewS": 120,
                    "nonceTtlS": 300,
                },
            },
            "upstream": {
                "protocol": "skill-v1",
                "address": "http://127.0.0.1:4050",
                "skill": {
                    "skillId": "demo.echo",
                    "capabilities": ["demo.echo"],
                    "auth": {
                        "mode": "api_key",
                        "existingSecret": "echo-api-key",
                        "secretKey": "api-key",
                    },
                },
            },
            "pairing": {
                "enabled": True,
                "componentId": "echo",
                "gatewayPublicKeyEd25519": GATEWAY_KEY,
                "tls": {"existingSecret": "echo-pairing-tls"},
            },
            "sharedState": {
                "backend": "redis",
                "redis": {"url": "redis://10.0.0.7:6379/1"},
            },
            "networkPolicy": {
                "pairingFrom": [{"podSelector": {"matchLabels": {"app": "pairing-job"}}}],
            },
            "limits": {"max_body_bytes": 2097152, "max_in_flight": 64},
            "runtime": {"workerThreads": 2},
        },
        "replicas": 2,
        "app": "app",
        "front": "skill-v1",
        "app_address": "http://127.0.0.1:4050",
        "pairing": True,
        "identity_secret": f"{RELEASE}-carapace-identity",
        "secrets": {
            "carapace-identity": (f"{RELEASE}-carapace-identity", None),
            "carapace-front-keys": ("skill-keys", ["2026-11", "2026-05"]),
            "carapace-upstream-secret": ("echo-api-key", ["api-key"]),
            "carapace-pairing-tls": ("echo-pairing-tls", ["tls.crt", "tls.key"]),
        },
        "redis": {
            "url": "redis://10.0.0.7:6379/1",
            # No keyPrefix in the values: the release's own name keeps tool hosts apart.
            "key_prefix": f"{RELEASE}-carapace:",
            "timeout_ms": 250,
        },
    },
    # An MCP endpoint on two replicas, sharing the key that seals older-era session ids.
    "mcp-front": {
        "values": {
            "replicaCount": 2,
            "front": {
                "protocol": "mcp",
                "mcp": {
                    "allowedOrigins": ["https://agent.example"],
                    "listTtlMs": 30000,
                    "sessionKey": {"existingSecret": "mcp-session", "key": "session.key"},
                    "sessionIdleTimeoutS": 600,
                },
                "oauth": {
                    "resource": "https://tools.example.com/mcp",
                    "issuer": "https://auth.example.com",
                    "jwks_url": "https://auth.example.com/.well-known/jwks.json",
                    "scopes": {"tools": ["tool.call:*"], "tools:read": ["tool.call:memory.query"]},
                    "challenge_scope": "tools:read",
                },
                "eat": {
                    "base_url": "https://tools.example.com",
                    "title": "Memory",
                    "tools": {"memory.query": {"capabilities": ["memory", "read-only"]}},
                },
                "eatKeys": {"existingSecret": "eat-keys", "key": "eat-keys.json"},
            },
        },
        "replicas": 2,
        "app": "app",
        "front": "mcp",
        "app_address": "http://127.0.0.1:8080",
        "pairing": False,
        "identity_secret": f"{RELEASE}-carapace-identity",
        "secrets": {
            "carapace-identity": (f"{RELEASE}-carapace-identity", None),
            "carapace-mcp-session-key": ("mcp-session", ["session.key"]),
            "carapace-eat-keys": ("eat-keys", ["eat-keys.json"]),
        },
        "redis": None,
        "mcp": {
            "path": "/mcp",
            "allowed_origins": ["https://agent.example"],
            "list_ttl_ms": 30000,
            "session_idle_timeout_s": 600,
            "session_key": {"file": "/etc/carapace/mcp-session/session.key"},
        },
        "oauth": {
            "resource": "https://tools.example.com/mcp",
            "issuer": "https://auth.example.com",
            "jwks_url": "https://auth.example.com/.well-known/jwks.json",
            "scopes": {"tools": ["tool.call:*"], "tools:read": ["tool.call:memory.query"]},
            "challenge_scope": "tools:read",
        },
        "eat": {
            "base_url": "https://tools.example.com",
            "title": "Memory",
            "tools": {"memory.query": {"capabilities": ["memory", "read-only"]}},
            "keys_file": "/etc/carapace/eat-keys/eat-keys.json",
        },
    },
    # An MCP server (Streamable HTTP on loopback) behind carapace, with some tools filtered.
    "mcp-server": {
        "values": {
            "app": {"args": ["serve", "--port", "3001"]},
            "upstream": {
                "protocol": "mcp",
                "address": "http://127.0.0.1:3001",
                "mcpPath": "/v1/mcp",
                "filter": {
                    "deny": ["delete_*"],
                    "rename": {"read_file": "files.read"},
                    "descriptions": {"files.read": "Read a file of the shared volume."},
                },
                "pinning": {"mode": "enforce", "pins": {"files.read": "sha256:" + "ab" * 32}},
            },
            "secretGuard": {"inbound": "enforce", "tools": {"files.read": "refuse"}},
            "callerTools": {"enabled": True, "timeout_ms_default": 30000},
            "receipts": {"sign": True, "provider_id": "files-host"},
            "ledger": {"enabled": True, "on_full": "refuse"},
            "idempotency": {"window_s": 600},
            "tools": {"files.write": {"price": 5}},
            "metering": {"budgets": {"gw_home": {"per_day": 100}}},
        },
        "replicas": 1,
        "app": "app",
        "front": "tools-v1",
        "app_address": "http://127.0.0.1:3001",
        "pairing": False,
        "identity_secret": f"{RELEASE}-carapace-identity",
        "secrets": {"carapace-identity": (f"{RELEASE}-carapace-identity", None)},
        "redis": None,
        "app_mcp": {"path": "/v1/mcp"},
        "app_filter": {
            "deny": ["delete_*"],
            "rename": {"read_file": "files.read"},
            "descriptions": {"files.read": "Read a file of the shared volume."},
        },
        "app_pinning": {"mode": "enforce", "pins": {"files.read": "sha256:" + "ab" * 32}},
        "secret_guard": {"inbound": "enforce", "tools": {"files.read": "refuse"}},
        "caller_tools": {"timeout_ms_default": 30000},
        "receipts": {"sign": True, "provider_id": "files-host"},
        "ledger": {"on_full": "refuse"},
        "idempotency": {"window_s": 600},
        "metering": {"budgets": {"gw_home": {"per_day": 100}}},
    },
    # The outbound role: the app (an agent) calls paired tool hosts through a Unix socket.
    "gateway": {
        "values": {
            "role": "gateway",
            "gateway": {
                "id": "gw_home",
                "peers": {
                    "memory-east": {"url": "https://10.96.0.15:8443", "receipts": "require"},
                    "files-west": {"url": "https://10.96.0.16:8443", "httpSignature": True},
                },
                "discoveryIntervalS": 30,
                "health": {"failures_to_open": 3},
            },
            "state": {"existingClaim": "gateway-state"},
        },
        "replicas": 1,
        "app": "app",
        "front": "tools-v1",
        "app_address": "http://127.0.0.1:8080",
        "pairing": False,
        "identity_secret": None,
        "secrets": {},
        "redis": None,
    },
}


# ---------------------------------------------------------------------------------------
# Rendering


def carapace_bin() -> Path:
    path = Path(os.environ.get("CARAPACE_BIN", REPO / "target" / "debug" / "carapace"))
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(
            f"carapace binary not found at {path}: build it (cargo build) or set CARAPACE_BIN",
            pytrace=False,
        )
    return path


@functools.cache
def config_schema() -> dict[str, Any]:
    out = subprocess.run(
        [str(carapace_bin()), "config-schema"], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


class Rendered:
    """The objects of one render, by kind and name."""

    def __init__(self, manifests: dict[str, str]):
        self.manifests = manifests
        self.docs: list[dict[str, Any]] = []
        for path, text in sorted(manifests.items()):
            if not path.endswith((".yaml", ".yml")):
                continue  # NOTES.txt
            for doc in yaml.safe_load_all(text):
                if doc:
                    self.docs.append(doc)

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [d for d in self.all(kind) if name is None or d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
        return found[0]

    def config_map(self) -> dict[str, Any]:
        return self.one("ConfigMap")

    def config_text(self) -> str:
        return self.config_map()["data"]["carapace.yaml"]

    def config(self) -> dict[str, Any]:
        return yaml.safe_load(self.config_text())


def render_chart(path: Path, values: dict[str, Any]) -> Rendered:
    with helm.Chart.load(path) as chart:
        return Rendered(
            chart.render(copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE, is_install=True)
        )


@functools.cache
def _render_case(name: str) -> Rendered:
    return render_chart(CHART, CASES[name]["values"])


@pytest.fixture(params=sorted(CASES))
def case(request) -> tuple[dict[str, Any], Rendered]:
    return CASES[request.param], _render_case(request.param)


def pod_spec(r: Rendered) -> dict[str, Any]:
    return r.one("Deployment")["spec"]["template"]["spec"]


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in spec["containers"] if c["name"] == name]
    assert len(found) == 1, f"no single container {name} in {[c['name'] for c in spec['containers']]}"
    return found[0]


def volumes(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in spec["volumes"]}


def mounts(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in c.get("volumeMounts", [])}


def ports(c: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c.get("ports", [])}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# ---------------------------------------------------------------------------------------
# The validators themselves


def test_strict_validation_refuses_unknown_fields():
    """The strict Kubernetes schemas are in force: a misspelt field is an error."""
    good = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x"},
        "data": {"a": "b"},
    }
    kubernetes_validate.validate(good, KUBE_VERSION, strict=True)
    bad = copy.deepcopy(good)
    bad["metadata"]["lables"] = {"a": "b"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSION, strict=True)


def test_carapace_config_schema_refuses_unknown_keys():
    """The configuration schema is strict too, so a key the chart misspells fails below."""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {"state_dir": "/x", "front": {"protocol": "tools-v1"}, "listeners": {},
             "app": {"protocol": "tools-v1", "address": "http://127.0.0.1:1"}, "ops": {"adress": ""}},
            config_schema(),
        )


# ---------------------------------------------------------------------------------------
# The chart's own Deployment, for every case


@pytest.mark.parametrize("name", sorted(CASES))
def test_lint(name):
    report = helm.lint(
        CHART, copy.deepcopy(CASES[name]["values"]), strict=True, namespace=NAMESPACE,
        kube_version=f"v{KUBE_VERSION}",
    )
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_every_manifest_validates_strictly(case):
    expect, r = case
    kinds = sorted(d["kind"] for d in r.docs)
    wanted = ["ConfigMap", "Deployment", "NetworkPolicy"]
    if expect["values"].get("role") != "gateway":
        wanted.append("Service")  # the tool port
    if expect["pairing"]:
        wanted.append("Service")
    assert kinds == sorted(wanted)
    for doc in r.docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        assert doc["metadata"]["namespace"] == NAMESPACE


def test_carapace_sidecar_beside_the_app(case):
    expect, r = case
    dep = r.one("Deployment", f"{RELEASE}-carapace")
    assert dep["spec"]["replicas"] == expect["replicas"]
    spec = pod_spec(r)
    assert [c["name"] for c in spec["containers"]] == [expect["app"], "carapace"]
    c = container(spec, "carapace")
    assert c["image"] == "carapace:0.1.0"
    assert c["args"] == ["serve", "--config", CONFIG_PATH]
    m = mounts(c)["carapace-config"]
    assert (m["mountPath"], m["subPath"], m["readOnly"]) == (CONFIG_PATH, "carapace.yaml", True)
    assert volumes(spec)["carapace-config"]["configMap"]["name"] == r.config_map()["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is False
    # The pods select themselves.
    assert selects(dep["spec"]["selector"]["matchLabels"], dep["spec"]["template"]["metadata"]["labels"])


def test_ports_and_probes(case):
    expect, r = case
    c = container(pod_spec(r), "carapace")
    want = {"ops": 9464}
    if expect["identity_secret"]:
        want["tools"] = 8443
    if expect["pairing"]:
        want["pairing"] = 7443
    assert ports(c) == want
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = c[probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == (path, "ops", "HTTP")
    # The ops listener is where the probes knock, reachable from the kubelet.
    assert r.config()["ops"] == {"address": "0.0.0.0:9464"}
    # The app's port is loopback only: the app container publishes nothing.
    assert "ports" not in container(pod_spec(r), expect["app"])


def test_security_context(case):
    _, r = case
    spec = pod_spec(r)
    sc = container(spec, "carapace")["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 65532 and sc["runAsGroup"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["securityContext"]["fsGroup"] == 65532
    assert container(spec, "carapace")["resources"] == {
        "requests": {"cpu": "50m", "memory": "32Mi"},
        "limits": {"memory": "128Mi"},
    }


def test_state_dir_on_a_volume(case):
    expect, r = case
    spec = pod_spec(r)
    cfg = r.config()
    assert cfg["state_dir"] == STATE
    # state_dir is a directory carapace makes inside the volume (the volume's own root
    # belongs to root with a mode others may enter, which carapace refuses for its keys).
    mount = mounts(container(spec, "carapace"))["carapace-state"]["mountPath"]
    assert mount == STATE_VOLUME
    assert cfg["state_dir"].startswith(mount + "/")
    state = volumes(spec)["carapace-state"]
    if expect["values"].get("role") == "gateway":
        assert state["persistentVolumeClaim"] == {"claimName": "gateway-state"}
    else:
        assert state["emptyDir"] == {"sizeLimit": "64Mi"}
    assert "admin" not in cfg  # the admin socket stays <state_dir>/admin.sock
    # ...which the commands run in the container (`carapace pair`, `kill-switch`, `peers`)
    # are told through the environment, since their own default is the image's.
    env = {e["name"]: e.get("value") for e in container(spec, "carapace").get("env", [])}
    assert env["CARAPACE_ADMIN_SOCKET"] == cfg["state_dir"] + "/admin.sock"


def test_the_users_environment_goes_beside_the_admin_socket():
    r = render_chart(CHART, {"env": [{"name": "RUST_LOG", "value": "debug"}]})
    env = container(pod_spec(r), "carapace")["env"]
    assert env == [
        {"name": "CARAPACE_ADMIN_SOCKET", "value": STATE + "/admin.sock"},
        {"name": "RUST_LOG", "value": "debug"},
    ]


def test_secrets_mounted_read_only(case):
    expect, r = case
    spec = pod_spec(r)
    vols = volumes(spec)
    c_mounts = mounts(container(spec, "carapace"))
    secret_vols = {n: v for n, v in vols.items() if "secret" in v}
    assert set(secret_vols) == set(expect["secrets"])
    for name, (secret_name, keys) in expect["secrets"].items():
        secret = secret_vols[name]["secret"]
        assert secret["secretName"] == secret_name
        assert secret["defaultMode"] == 0o440
        if keys is None:
            assert "items" not in secret  # the whole Secret (peers.json is optional)
        else:
            assert secret["items"] == [{"key": k, "path": k} for k in keys]
        assert c_mounts[name]["readOnly"] is True, name
    # The app container sees none of carapace's secrets.
    app_mounts = mounts(container(spec, expect["app"]))
    assert not set(app_mounts) & set(secret_vols)


def test_config_follows_the_carapace_schema(case):
    _, r = case
    jsonschema.validate(r.config(), config_schema())


def carapace_check(config_text: str, tmp_path: Path) -> None:
    """`carapace check` loads the rendered file, with the mounted files laid out under tmp."""
    text = config_text
    for prefix in ("/etc/carapace/", "/var/lib/carapace", "/run/carapace"):
        text = text.replace(prefix, f"{tmp_path}{prefix}")
    cfg = yaml.safe_load(text)

    def files(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("file", "cert_file", "key_file", "client_ca_file", "keys_file") and isinstance(v, str):
                    yield v
                else:
                    yield from files(v)
        elif isinstance(node, list):
            for v in node:
                yield from files(v)

    for f in files(cfg):
        if f.endswith("peers.json"):
            continue  # a missing peer store is an empty one
        Path(f).parent.mkdir(parents=True, exist_ok=True)
        # Long enough for every secret (an MCP session key is at least 32 bytes).
        Path(f).write_text("not-empty-placeholder-secret-of-forty-eight-byte\n")
    path = tmp_path / "carapace.yaml"
    path.write_text(text)
    out = subprocess.run(
        [str(carapace_bin()), "check", "-c", str(path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_config_passes_carapace_check(case, tmp_path):
    _, r = case
    carapace_check(r.config_text(), tmp_path)


def test_config_values(case):
    expect, r = case
    cfg = r.config()
    gateway = expect["values"].get("role") == "gateway"
    assert cfg["front"]["protocol"] == expect["front"]
    assert cfg["app"]["address"] == expect["app_address"]
    assert cfg["log"] == {"format": "json", "level": "info"}
    spec = pod_spec(r)
    c_mounts = mounts(container(spec, "carapace"))
    if gateway:
        assert cfg["listeners"] == {"unix": {"path": f"{RUN}/tools.sock", "mode": "0660"}}
        assert "peers" not in cfg  # the gateway's own peer store, in state_dir
    else:
        identity = c_mounts["carapace-identity"]["mountPath"]
        assert identity == IDENTITY
        tls = cfg["listeners"]["tcp"]["tls"]
        assert cfg["listeners"]["tcp"]["address"] == "0.0.0.0:8443"
        assert tls["cert_file"] == f"{identity}/tls.crt"
        assert tls["key_file"] == f"{identity}/tls.key"
        if expect["front"] in ("tools-v1", "mcp"):
            assert tls["client_ca_file"] == f"{identity}/ca.crt"
        else:
            assert "client_ca_file" not in tls  # skill-v1 callers sign instead
    assert cfg["app"].get("mcp") == expect.get("app_mcp")
    assert cfg["app"].get("filter") == expect.get("app_filter")
    assert cfg["app"].get("pinning") == expect.get("app_pinning")
    assert cfg.get("secret_guard") == expect.get("secret_guard")
    assert cfg.get("caller_tools") == expect.get("caller_tools")
    for key in ("receipts", "ledger", "idempotency", "metering"):
        assert cfg.get(key) == expect.get(key), key
    assert cfg["front"].get("oauth") == expect.get("oauth")
    assert cfg["front"].get("eat") == expect.get("eat")
    if "mcp" in expect:
        assert cfg["front"]["mcp"] == expect["mcp"]
        assert cfg["peers"] == {"file": f"{identity}/peers.json"}
    if expect["redis"]:
        assert cfg["shared_state"] == {"backend": "redis", "redis": expect["redis"]}
        if "password" in expect["redis"]:
            mount = c_mounts["carapace-redis-password"]["mountPath"]
            assert expect["redis"]["password"]["file"].startswith(mount + "/")
    else:
        assert cfg["shared_state"] == {"backend": "memory"}
    if expect["pairing"]:
        p = cfg["pairing"]
        assert p["listen"] == "0.0.0.0:7443"
        assert p["gateway_public_key_ed25519"] == GATEWAY_KEY
        assert p["component_id"] == expect["values"]["pairing"]["componentId"]
        tls_mount = c_mounts.get("carapace-pairing-tls", c_mounts.get("carapace-identity"))
        assert p["tls"] == {
            "cert_file": f"{tls_mount['mountPath']}/tls.crt",
            "key_file": f"{tls_mount['mountPath']}/tls.key",
        }
    else:
        assert "pairing" not in cfg


def test_checksum_annotation(case):
    expect, r = case
    annotations = r.one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    digest = hashlib.sha256(r.config_text().rstrip("\n").encode()).hexdigest()
    assert annotations["checksum/config"] == digest
    # A config change rolls the pods; a change elsewhere does not.
    values = copy.deepcopy(expect["values"])
    values["log"] = {"format": "json", "level": "debug"}
    changed = render_chart(CHART, values)
    ann = changed.one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert ann["checksum/config"] != digest
    values = copy.deepcopy(expect["values"])
    values["podLabels"] = {"team": "tools"}
    same = render_chart(CHART, values)
    ann = same.one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert ann["checksum/config"] == digest


# ---------------------------------------------------------------------------------------
# Services and NetworkPolicy


def test_tool_service(case):
    expect, r = case
    pod_labels = r.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    tool = [s for s in r.all("Service") if s["metadata"]["name"] == f"{RELEASE}-carapace"]
    if expect["values"].get("role") == "gateway":
        assert tool == []
        return
    (svc,) = tool
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [
        {"name": "tools", "port": 8443, "targetPort": "tools", "protocol": "TCP"}
    ]
    assert selects(svc["spec"]["selector"], pod_labels)


def test_pairing_service(case):
    expect, r = case
    pod_labels = r.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    found = [s for s in r.all("Service") if s["metadata"]["name"] == f"{RELEASE}-carapace-pairing"]
    if not expect["pairing"]:
        assert found == []
        return
    (svc,) = found
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [
        {"name": "pairing", "port": 7443, "targetPort": "pairing", "protocol": "TCP"}
    ]
    assert selects(svc["spec"]["selector"], pod_labels)


@pytest.mark.parametrize("service_type", ["NodePort", "LoadBalancer"])
def test_pairing_service_stays_cluster_ip(service_type):
    values = copy.deepcopy(CASES["memory-sidecar"]["values"])
    values["service"]["type"] = service_type
    r = render_chart(CHART, values)
    assert r.one("Service", f"{RELEASE}-carapace")["spec"]["type"] == service_type
    pairing = r.one("Service", f"{RELEASE}-carapace-pairing")["spec"]
    assert pairing["type"] == "ClusterIP"
    assert [p["port"] for p in pairing["ports"]] == [7443]
    for doc in r.docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def rules_by_port(policy: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for rule in policy["spec"]["ingress"]:
        assert [p["protocol"] for p in rule["ports"]] == ["TCP"]
        assert len(rule["ports"]) == 1, "one port per rule: each port has its own peers"
        assert rule["from"], "an empty 'from' would admit every source"
        out[rule["ports"][0]["port"]] = rule["from"]
    return out


def test_network_policy(case):
    expect, r = case
    np = r.one("NetworkPolicy")
    pod_labels = r.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selects(np["spec"]["podSelector"]["matchLabels"], pod_labels)
    assert np["spec"]["policyTypes"] == ["Ingress"]
    rules = rules_by_port(np)
    v = expect["values"].get("networkPolicy", {})
    want = {}
    if expect["values"].get("role") != "gateway":
        want["tools"] = v.get("toolPortFrom", [{"podSelector": {}}])
    if expect["pairing"] and v.get("pairingFrom"):
        want["pairing"] = v["pairingFrom"]
    if v.get("opsFrom"):
        want["ops"] = v["opsFrom"]
    assert rules == want


def test_network_policy_memory_sidecar_details():
    r = _render_case("memory-sidecar")
    rules = rules_by_port(r.one("NetworkPolicy"))
    # Only the gateway reaches the tool port, nobody in the cluster the pairing port,
    # only monitoring the ops port.
    assert rules["tools"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agents"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "gateway"}},
    }]
    assert "pairing" not in rules
    assert rules["ops"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def test_network_policy_can_be_disabled():
    r = render_chart(CHART, {"networkPolicy": {"enabled": False}})
    assert r.all("NetworkPolicy") == []


def test_network_policy_with_no_peers_admits_nothing():
    r = render_chart(CHART, {"networkPolicy": {"enabled": True, "toolPortFrom": []}})
    np = r.one("NetworkPolicy")
    assert np["spec"]["ingress"] == []
    kubernetes_validate.validate(np, KUBE_VERSION, strict=True)


# ---------------------------------------------------------------------------------------
# The gateway role


def test_gateway_role():
    r = _render_case("gateway")
    cfg = r.config()
    assert cfg["gateway"] == {"id": "gw_home"}
    assert cfg["outbound"] == {
        "socket": f"{RUN}/outbound.sock",
        "peers": {
            "memory-east": {"url": "https://10.96.0.15:8443", "receipts": "require"},
            "files-west": {"url": "https://10.96.0.16:8443", "http_signature": True},
        },
        "discovery_interval_s": 30,
        "health": {"failures_to_open": 3},
    }
    spec = pod_spec(r)
    # The agent and carapace share the socket directory.
    assert volumes(spec)["carapace-run"]["emptyDir"]["medium"] == "Memory"
    assert mounts(container(spec, "app"))["carapace-run"]["mountPath"] == RUN
    assert mounts(container(spec, "carapace"))["carapace-run"]["mountPath"] == RUN
    assert r.one("Deployment")["spec"]["strategy"] == {"type": "Recreate"}


# ---------------------------------------------------------------------------------------
# Values the chart refuses


REFUSED = {
    "unknown role": ({"role": "toolhost"}, "/role"),
    "service.type typo": ({"service": {"type": "Loadbalancer"}}, "/service/type"),
    "unknown key": ({"replicas": 3}, "replicas"),
    "front protocol": ({"front": {"protocol": "tools-v2"}}, "/front/protocol"),
    "app off loopback": ({"upstream": {"address": "http://10.0.0.5:8080"}}, "/upstream/address"),
    "pairing without component id": (
        {"pairing": {"enabled": True, "gatewayPublicKeyEd25519": GATEWAY_KEY}},
        "/pairing/componentId",
    ),
    "pairing with a bad key": (
        {"pairing": {"enabled": True, "componentId": "x", "gatewayPublicKeyEd25519": "abc"}},
        "/pairing/gatewayPublicKeyEd25519",
    ),
    "redis without url": ({"sharedState": {"backend": "redis"}}, "/sharedState/redis/url"),
    "redis scheme": (
        {"sharedState": {"backend": "redis", "redis": {"url": "http://redis:6379"}}},
        "/sharedState/redis/url",
    ),
    "skill-v1 front without keys": (
        {"front": {"protocol": "skill-v1", "skillId": "s", "auth": {"existingSecret": "k"}}},
        "/front/auth/keys",
    ),
    "keys on a tools-v1 front": (
        {"front": {"auth": {"existingSecret": "k", "keys": ["a"]}}},
        "/front/auth/keys",
    ),
    "skill-v1 app without skill id": (
        {"upstream": {"protocol": "skill-v1", "address": "http://127.0.0.1:4050"}},
        "/upstream/skill/skillId",
    ),
    "signed skill without secret": (
        {"upstream": {"protocol": "skill-v1", "skill": {"skillId": "s", "auth": {"mode": "hmac"}}}},
        "/upstream/skill/auth/existingSecret",
    ),
    "log format": ({"log": {"format": "yaml"}}, "/log/format"),
    "gateway without id": ({"role": "gateway"}, "/gateway/id"),
    "gateway with pairing": (
        {"role": "gateway", "gateway": {"id": "gw"},
         "pairing": {"enabled": True, "componentId": "x", "gatewayPublicKeyEd25519": GATEWAY_KEY}},
        "/pairing/enabled",
    ),
    "gateway replicas": (
        {"role": "gateway", "gateway": {"id": "gw"}, "replicaCount": 2}, "/replicaCount",
    ),
    "rate limit typo": ({"rateLimits": {"per_peer": {"per_second": 5, "burts": 5}}}, "/rateLimits/per_peer"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_values_schema_refuses(name):
    values, where = REFUSED[name]
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError) as err:
            chart.render(copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE)
    assert where in str(err.value), str(err.value)
    report = helm.lint(CHART, copy.deepcopy(values), namespace=NAMESPACE)
    assert report["errors"], report


def test_template_refuses_per_replica_nonces():
    """A signed front on several replicas must share its nonces, or a replay passes."""
    values = copy.deepcopy(CASES["skill-front"]["values"])
    values["sharedState"] = {"backend": "memory"}
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmRenderError, match="sharedState.backend"):
            chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_template_refuses_per_replica_session_keys():
    """An MCP front on several replicas must share its session key, or sessions break."""
    values = copy.deepcopy(CASES["mcp-front"]["values"])
    values["front"]["mcp"]["sessionKey"]["existingSecret"] = ""
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmRenderError, match="front.mcp.sessionKey"):
            chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_template_refuses_per_replica_eat_keys():
    """An EAT catalog on several replicas must share its signing keys, or signatures break."""
    values = copy.deepcopy(CASES["mcp-front"]["values"])
    values["front"]["eatKeys"]["existingSecret"] = ""
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmRenderError, match="front.eatKeys"):
            chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_values_documented():
    """Every top-level value has a comment in values.yaml and a place in the schema."""
    text = (CHART / "values.yaml").read_text().splitlines()
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load("\n".join(text))
    for key in values:
        line = next(i for i, l in enumerate(text) if l.startswith(f"{key}:"))
        assert text[line - 1].startswith("#"), f"{key} has no comment above it"
        assert key in schema["properties"], key


# ---------------------------------------------------------------------------------------
# A parent chart that adds carapace to its own pods


@pytest.fixture(scope="module")
def consumer(tmp_path_factory) -> Path:
    """A copy of the consumer chart with its file:// dependency resolved (offline)."""
    root = tmp_path_factory.mktemp("charts") / "charts"
    shutil.copytree(CHART, root / "carapace")
    dest = root / CONSUMER.relative_to(CHARTS)
    shutil.copytree(CONSUMER, dest, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
    helm.dependency_update(dest)
    assert [d["status"] for d in helm.dependency_list(dest)] == ["ok"]
    return dest


@pytest.fixture(scope="module")
def consumer_rendered(consumer) -> Rendered:
    return render_chart(consumer, {})


def test_consumer_lint(consumer):
    report = helm.lint(
        consumer, None, strict=True, with_subcharts=True, namespace=NAMESPACE,
        kube_version=f"v{KUBE_VERSION}",
    )
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_consumer_manifests_validate_strictly(consumer_rendered):
    r = consumer_rendered
    assert sorted(d["kind"] for d in r.docs) == ["ConfigMap", "Deployment", "NetworkPolicy", "Service"]
    for doc in r.docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_consumer_pod_carries_carapace(consumer_rendered):
    r = consumer_rendered
    dep = r.one("Deployment", f"{RELEASE}-consumer")  # the parent's; carapace's own is off
    spec = dep["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["memory", "carapace"]
    c = container(spec, "carapace")
    assert c["args"] == ["serve", "--config", CONFIG_PATH]
    assert ports(c) == {"tools": 8443, "ops": 9464}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["fsGroup"] == 65532
    vols = volumes(spec)
    # The volumes point at the ConfigMap the dependency rendered, and the identity Secret.
    assert vols["carapace-config"]["configMap"]["name"] == r.config_map()["metadata"]["name"]
    assert vols["carapace-identity"]["secret"]["secretName"] == "consumer-identity"
    assert mounts(c)["carapace-identity"] == {
        "name": "carapace-identity", "mountPath": IDENTITY, "readOnly": True,
    }
    assert set(mounts(c)) <= set(vols)
    # The checksum of the dependency's config rolls the parent's pods.
    digest = hashlib.sha256(r.config_text().rstrip("\n").encode()).hexdigest()
    assert dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"] == digest
    # carapace's Service and NetworkPolicy select the parent's pods.
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert selects(r.one("Service")["spec"]["selector"], labels)
    assert selects(r.one("NetworkPolicy")["spec"]["podSelector"]["matchLabels"], labels)


def test_consumer_config(consumer_rendered, tmp_path):
    cfg = consumer_rendered.config()
    jsonschema.validate(cfg, config_schema())
    carapace_check(consumer_rendered.config_text(), tmp_path)
    assert cfg["front"] == {"protocol": "tools-v1"}
    assert cfg["app"] == {"protocol": "tools-v1", "address": "http://127.0.0.1:8080"}
    assert cfg["listeners"]["tcp"]["tls"]["client_ca_file"] == f"{IDENTITY}/ca.crt"


def test_consumer_values_are_checked_by_the_carapace_schema(consumer):
    with helm.Chart.load(consumer) as chart:
        with pytest.raises(helm.HelmValuesError, match="/service/type"):
            chart.render({"carapace": {"service": {"type": "Loadbalancer"}}}, name=RELEASE)


def test_tools_front_with_rfc9421_signatures():
    """`front.auth.mode: http_signature` on a tools-v1 front: the keys mounted from their
    Secret, the config's auth as carapace takes it, and replicas refused without Redis."""
    values = {
        "front": {
            "protocol": "tools-v1",
            "auth": {"mode": "http_signature", "existingSecret": "caller-keys", "keys": ["k1"]},
        },
    }
    r = render_chart(CHART, copy.deepcopy(values))
    cfg = r.config()
    assert cfg["front"]["auth"] == {
        "mode": "http_signature",
        "keys": [{"id": "k1", "secret": {"file": f"{KEYS}/k1"}}],
    }
    jsonschema.validate(cfg, config_schema())
    spec = pod_spec(r)
    assert volumes(spec)["carapace-front-keys"]["secret"]["secretName"] == "caller-keys"
    assert mounts(container(spec, "carapace"))["carapace-front-keys"]["mountPath"] == KEYS
    values["replicaCount"] = 2
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmRenderError, match="sharedState.backend"):
            chart.render(values, name=RELEASE, namespace=NAMESPACE)
