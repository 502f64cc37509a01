use std::path::Path;

use super::secrets::{load_secret, SecretRef};
use super::{parse, AppAddress, AppTarget, ConfigErrors};

fn errors(text: &str) -> Vec<String> {
    match parse(text, Path::new("/nonexistent")) {
        Ok(_) => vec![],
        Err(ConfigErrors(e)) => e.into_iter().map(|e| e.to_string()).collect(),
    }
}

const MINIMAL: &str = "
state_dir: /tmp/carapace-test
front: { protocol: tools-v1 }
listeners: { unix: { path: /tmp/carapace-test/tools.sock } }
app: { protocol: tools-v1, address: 'http://127.0.0.1:8080' }
";

#[test]
fn minimal_config_loads_with_defaults() {
    let l = parse(MINIMAL, Path::new("/")).unwrap();
    assert_eq!(
        l.app_target,
        AppTarget::Http(AppAddress::Tcp("127.0.0.1:8080".parse().unwrap()))
    );
    assert_eq!(l.config.limits.max_body_bytes, 1 << 20);
    assert_eq!(l.ops_address, Some("127.0.0.1:9464".parse().unwrap()));
    assert_eq!(l.unix_mode, 0o660);
}

#[test]
fn every_structural_error_is_named() {
    let e = errors(
        "
state_dir: /tmp/x
front: { protocol: tools-v2, colour: blue }
listeners: { unix: { path: 12, mode: '0600' }, udp: {} }
app: { protocol: tools-v1 }
limits: { max_body_bytes: -1 }
",
    );
    let all = e.join("\n");
    for needle in [
        "/front",
        "colour",
        "tools-v2",
        "udp",
        "address",
        "/limits/max_body_bytes",
    ] {
        assert!(all.contains(needle), "missing {needle} in:\n{all}");
    }
    assert!(e.len() >= 5, "{all}");
}

#[test]
fn every_semantic_error_is_named() {
    let e = errors(
        "
state_dir: /tmp/x
front:
  protocol: skill-v1
  auth:
    mode: hmac
    keys:
      - { id: a, secret: { env: CARAPACE_TEST_UNSET_VAR } }
      - { id: a, secret: { file: /nonexistent/secret } }
    nonce_ttl_s: 10
listeners: { tcp: { address: '0.0.0.0:8443' } }
app: { protocol: tools-v1, address: 'http://10.0.0.1:80' }
rate_limits: { per_peer: { per_second: 0, burst: 1 } }
",
    );
    let all = e.join("\n");
    for needle in [
        "/front/skill_id",
        "CARAPACE_TEST_UNSET_VAR",
        "/front/auth/keys/1/id",
        "/front/auth/keys/1/secret",
        "/front/auth/nonce_ttl_s",
        "/listeners/tcp/tls",
        "/app/address",
        "/rate_limits/per_peer",
    ] {
        assert!(all.contains(needle), "missing {needle} in:\n{all}");
    }
}

#[test]
fn structural_and_semantic_errors_are_named_in_one_run() {
    let e = errors(
        "
state_dir: /tmp/x
front: { protocol: tools-v1, colour: blue }
listeners: { unix: { path: /tmp/x.sock } }
app: { protocol: tools-v1, address: 'http://10.0.0.1:80' }
limits: { max_in_flight: 0 }
",
    );
    let all = e.join("\n");
    for needle in ["colour", "/app/address", "/limits/max_in_flight"] {
        assert!(all.contains(needle), "missing {needle} in:\n{all}");
    }
}

#[test]
fn tools_front_on_tcp_requires_mtls() {
    let e = errors(
        "
state_dir: /tmp/x
front: { protocol: tools-v1 }
listeners: { tcp: { address: '127.0.0.1:8443', tls: { cert_file: /nonexistent/c, key_file: /nonexistent/k } } }
app: { protocol: tools-v1, address: 'unix:/tmp/app.sock' }
",
    );
    let all = e.join("\n");
    assert!(all.contains("client_ca_file"), "{all}");
    assert!(all.contains("cert_file"), "{all}");
}

#[test]
fn secrets_come_from_files_without_trailing_newline() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("k");
    std::fs::write(&f, "s3cret\n").unwrap();
    let s = load_secret(&SecretRef::File(f)).unwrap();
    assert_eq!(&**s.bytes(), b"s3cret");
    assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
}

#[test]
fn inline_secrets_are_not_accepted() {
    let e = errors(
        "
state_dir: /tmp/x
front:
  protocol: skill-v1
  skill_id: s
  auth: { mode: hmac, keys: [ { id: a, secret: 'hunter2' } ] }
listeners: { unix: { path: /tmp/x.sock } }
app: { protocol: tools-v1, address: 'http://127.0.0.1:1' }
",
    );
    assert!(e.join("\n").contains("/front/auth/keys/0/secret"), "{e:?}");
    // The value written there is the secret itself: it is not quoted back.
    assert!(!e.join("\n").contains("hunter2"), "{e:?}");
}

#[test]
fn shipped_examples_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&p).unwrap();
            // Examples refer to secrets by environment variable; provide them.
            std::env::set_var("SKILL_HMAC_KEY_2026_11", "k1");
            std::env::set_var("SKILL_HMAC_KEY_2026_05", "k0");
            std::env::set_var("LEGACY_SKILL_SECRET", "k2");
            // Only structure and secrets are checked here: TLS files are placeholders.
            if let Err(ConfigErrors(e)) = parse(&text, &dir) {
                let bad: Vec<_> = e.iter().filter(|e| !e.path.contains("/tls")).collect();
                assert!(bad.is_empty(), "{}: {bad:?}", p.display());
            }
            n += 1;
        }
    }
    assert!(n >= 2);
}

#[test]
fn the_shared_state_store_is_checked_without_echoing_secrets() {
    let redis = |r: &str| format!("{MINIMAL}shared_state: {{ backend: redis, redis: {r} }}");
    assert!(errors(&format!("{MINIMAL}shared_state: {{ backend: memory }}")).is_empty());
    for ok in [
        "{ url: 'redis://10.0.0.5:6379/2', key_prefix: 'a:' }",
        "{ url: 'unix:///run/redis.sock?db=2', key_prefix: 'a:' }",
    ] {
        assert!(
            errors(&redis(ok)).is_empty(),
            "{ok}: {:?}",
            errors(&redis(ok))
        );
    }
    let e = errors(&format!("{MINIMAL}shared_state: {{ backend: redis }}"));
    assert_eq!(e, ["/shared_state/redis: required for backend: redis"]);
    let e = errors(&format!(
        "{MINIMAL}shared_state: {{ redis: {{ url: 'redis://h:6379', key_prefix: p }} }}"
    ));
    assert!(e[0].starts_with("/shared_state/redis: set only with backend: redis"));
    let e = errors(&redis(
        "{ url: 'redis://u:hunter2@h:6379', key_prefix: p, timeout_ms: 0, \
             password: { env: CARAPACE_TEST_UNSET_PASSWORD } }",
    ));
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(e.iter().any(|m| m.contains("holds a password")), "{e:?}");
    assert!(e
        .iter()
        .any(|m| m.contains("timeout_ms: must be 1 to 10000")));
    assert!(e
        .iter()
        .any(|m| m.contains("CARAPACE_TEST_UNSET_PASSWORD is not set")));
    for (bad, says) in [
        (
            "{ url: 'rediss://h:6379', key_prefix: p }",
            "must start with redis://",
        ),
        (
            "{ url: 'redis:/:hunter2@h:6379', key_prefix: p }",
            "must start with redis://",
        ),
        (
            "{ url: 'redis://h:6379/0?password=hunter2', key_prefix: p }",
            "takes no query",
        ),
        (
            "{ url: 'redis://h:6379', key_prefix: '' }",
            "key_prefix: \"\" is shorter than 1 character",
        ),
        (
            "{ url: 'redis://h:6379', key_prefix: p, username: u }",
            "username: is used only",
        ),
    ] {
        let e = errors(&redis(bad));
        assert_eq!(e.len(), 1, "{bad}: {e:?}");
        assert!(e[0].contains(says), "{bad}: {e:?}");
        assert!(!e[0].contains("hunter2"), "{bad}: {e:?}");
    }
    // The shared limiter counts in microseconds; the local one has no such bound.
    let fast = "rate_limits: { per_tool: { per_second: 2000000, burst: 1 } }";
    let e = errors(&format!(
        "{}\n{fast}\n",
        redis("{ url: 'redis://h:6379', key_prefix: p }")
    ));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].contains("at most 1000000 with the redis backend"),
        "{e:?}"
    );
    assert!(errors(&format!("{MINIMAL}{fast}")).is_empty());
    let e = errors(&format!("{MINIMAL}shared_state: {{ backend: etcd }}"));
    assert!(e[0].starts_with("/shared_state/backend"), "{e:?}");
}

#[test]
fn oauth_is_checked_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    let private = dir.path().join("private.json");
    std::fs::write(
        &jwks,
        r#"{"keys": [{"kty": "EC", "crv": "P-256", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}, {"kty": "XYZ"}]}"#,
    )
    .unwrap();
    std::fs::write(
        &private,
        r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "d": "nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A"}]}"#,
    )
    .unwrap();
    let front = |oauth: &str, protocol: &str| {
        format!(
            "
state_dir: /tmp/x
front:
  protocol: {protocol}
  oauth: {oauth}
listeners: {{ unix: {{ path: /tmp/x/s.sock }} }}
app: {{ protocol: tools-v1, address: 'http://127.0.0.1:8080' }}
"
        )
    };
    let good = format!(
        "{{ resource: 'https://tools.example.com/mcp', issuer: 'https://auth.example.com', jwks_file: {}, scopes: {{ tools: ['tool.call:*'] }}, challenge_scope: tools }}",
        jwks.display()
    );
    let l = parse(&front(&good, "mcp"), Path::new("/")).unwrap();
    assert_eq!(
        l.oauth_keys.unwrap().keys.len(),
        1,
        "the unusable key is skipped"
    );
    let all = errors(&front(&good, "tools-v1")).join("\n");
    assert!(
        all.contains("/front/oauth: OAuth bearer tokens are for an mcp front"),
        "{all}"
    );
    let bad = format!(
        "{{ resource: 'http://tools.example.com/mcp', issuer: 'auth', jwks_file: {}, jwks_url: 'http://example.com/jwks', scopes: {{ 'a b': ['control:*'] }}, challenge_scope: nope, clock_skew_s: 9999 }}",
        jwks.display()
    );
    let all = errors(&front(&bad, "mcp")).join("\n");
    for expected in [
        "/front/oauth/resource: `http://tools.example.com/mcp` must be https",
        "/front/oauth/issuer",
        "/front/oauth: exactly one of jwks_file and jwks_url",
        "/front/oauth/scopes/a b: a scope is a non-empty token",
        "/front/oauth/scopes/a b/0: `control:*` is not a tool.call:",
        "/front/oauth/challenge_scope: `nope` is not a configured scope",
        "/front/oauth/clock_skew_s",
    ] {
        assert!(all.contains(expected), "{expected} in {all}");
    }
    let with_private = good.replace(&jwks.display().to_string(), &private.display().to_string());
    let all = errors(&front(&with_private, "mcp")).join("\n");
    assert!(all.contains("private key material"), "{all}");
    assert!(!all.contains("nWGxne"), "never echoes key material: {all}");
}

#[test]
fn each_front_takes_only_its_own_auth_modes() {
    let cfg = |protocol: &str, mode: &str| {
        format!(
            "
state_dir: /tmp/x
front:
  protocol: {protocol}
  skill_id: s
  auth: {{ mode: {mode}, keys: [] }}
listeners: {{ unix: {{ path: /tmp/x/s.sock }} }}
app: {{ protocol: tools-v1, address: 'http://127.0.0.1:8080' }}
"
        )
        .replace(
            "  skill_id: s\n",
            if protocol == "skill-v1" {
                "  skill_id: s\n"
            } else {
                ""
            },
        )
    };
    assert!(
        errors(&cfg("tools-v1", "http_signature")).is_empty(),
        "peers may sign alone"
    );
    assert!(errors(&cfg("mcp", "http_signature")).is_empty());
    let all = errors(&cfg("tools-v1", "hmac")).join("\n");
    assert!(
        all.contains("/front/auth/mode: a tools-v1 front takes only http_signature"),
        "{all}"
    );
    let all = errors(&cfg("skill-v1", "http_signature")).join("\n");
    assert!(
        all.contains("/front/auth/mode: a skill-v1 front signs its calls in the body"),
        "{all}"
    );
    let all = errors(&cfg("skill-v1", "hmac")).join("\n");
    assert!(
        all.contains("/front/auth/keys: at least one key is required"),
        "{all}"
    );
}

#[test]
fn the_outbound_listener_is_checked_with_its_oauth() {
    let all = errors(
        "
state_dir: /tmp/x
front: { protocol: tools-v1 }
listeners: { unix: { path: /tmp/x/s.sock } }
app: { protocol: tools-v1, address: 'http://127.0.0.1:8080' }
gateway: { id: gw }
outbound:
  socket: /tmp/x/out.sock
  peers: {}
  listen:
    address: nowhere
    cert_file: /nonexistent/c
    key_file: /nonexistent/k
    oauth: { resource: 'https://g.test/mcp', issuer: 'https://a.test', scopes: {} }
",
    )
    .join("\n");
    for expected in [
        "/outbound/listen/address: `nowhere` is not host:port",
        "/outbound/listen/cert_file",
        "/outbound/listen/key_file",
        "/outbound/listen/oauth: exactly one of jwks_file and jwks_url is required",
        "/outbound/listen/oauth/scopes: at least one scope is required",
    ] {
        assert!(all.contains(expected), "{expected} in {all}");
    }
}

#[test]
fn the_eat_catalog_is_checked_before_anything_starts() {
    let with = |front: &str| MINIMAL.replace("front: { protocol: tools-v1 }", front);
    let ok = parse(
        &with("front: { protocol: mcp, eat: { base_url: 'https://tools.example.com:8443' } }"),
        Path::new("/"),
    )
    .unwrap();
    let eat = ok.config.front.eat.as_ref().unwrap();
    assert_eq!(eat.did(), "did:web:tools.example.com%3A8443");
    assert_eq!(
        eat.server_url(Some("/mcp")),
        "https://tools.example.com:8443/mcp"
    );
    for (front, needle) in [
        (
            "front: { protocol: mcp, eat: { base_url: 'https://h.example/api' } }",
            "without a path",
        ),
        (
            "front: { protocol: mcp, eat: { base_url: 'http://127.0.0.1:8443' } }",
            "must be https",
        ),
        (
            "front: { protocol: tools-v1, eat: { base_url: 'https://h.example' } }",
            "/front/eat/server_url",
        ),
        (
            "front: { protocol: mcp, eat: { base_url: 'https://h.example', max_age_s: 3000 } }",
            "half of signature_ttl_s",
        ),
        (
            "front: { protocol: mcp, eat: { base_url: 'https://h.example', signature_ttl_s: 10 } }",
            "/front/eat/signature_ttl_s",
        ),
        (
            "front: { protocol: mcp, eat: { base_url: 'https://h.example', keys_file: /nonexistent/k.json } }",
            "/front/eat/keys_file",
        ),
        (
            "front: { protocol: mcp, eat: { base_url: 'https://h.example', tools: { t: { capabilities: ['a b'] } } } }",
            "/front/eat/tools/t/capabilities/0",
        ),
        (
            "front: { protocol: mcp, eat: { base_url: 'https://h.example', colour: 1 } }",
            "colour",
        ),
    ] {
        let all = errors(&with(front)).join("\n");
        assert!(all.contains(needle), "{front}: missing {needle} in:\n{all}");
    }
}

#[test]
fn the_outbound_eat_catalogs_are_checked() {
    let all = errors(
        "
state_dir: /tmp/x
front: { protocol: tools-v1 }
listeners: { unix: { path: /tmp/x/s.sock } }
app: { protocol: tools-v1, address: 'http://127.0.0.1:8080' }
gateway: { id: gw }
outbound:
  socket: /tmp/x/out.sock
  peers: { twin: { url: 'https://127.0.0.1:9443' } }
  eat:
    plain: { url: 'http://tools.test/.well-known/api-catalog', capabilities: [] }
    half: { url: 'https://tools.test/.well-known/api-catalog', capabilities: ['*'], cert_file: /nonexistent/c }
    twin: { url: 'https://tools.test/.well-known/api-catalog', capabilities: [a], clock_skew_s: 9999 }
",
    )
    .join("\n");
    for expected in [
        "/outbound/eat/plain/url",
        "/outbound/eat/plain/capabilities",
        "/outbound/eat/half/cert_file: cert_file and key_file go together",
        "/outbound/eat/half/cert_file: /nonexistent/c",
        "/outbound/eat/twin/clock_skew_s",
        "/outbound/eat/twin: a peer or skill has this id",
    ] {
        assert!(all.contains(expected), "{expected} in {all}");
    }
}

#[test]
fn the_caller_tool_relay_is_checked() {
    let ok = parse(&format!("{MINIMAL}caller_tools: {{}}\n"), Path::new("/")).unwrap();
    let c = ok.config.caller_tools.unwrap();
    assert_eq!(c.timeout_ms_default, 60_000);
    assert_eq!(c.keepalive_s, 15);
    let all = errors(&format!(
        "{MINIMAL}caller_tools: {{ max_tools_per_caller: 0, timeout_ms_default: 5000, timeout_ms_max: 1000, keepalive_s: 0, colour: 1 }}\n"
    ))
    .join("\n");
    assert!(all.contains("colour"), "{all}");
    let all = errors(&format!(
        "{MINIMAL}caller_tools: {{ max_tools_per_caller: 0, timeout_ms_default: 5000, timeout_ms_max: 1000, keepalive_s: 0 }}\n"
    ))
    .join("\n");
    for needle in [
        "/caller_tools/max_tools_per_caller",
        "/caller_tools/timeout_ms_default",
        "/caller_tools/keepalive_s",
    ] {
        assert!(all.contains(needle), "{needle} in {all}");
    }
}

#[test]
fn budgets_on_replicas_must_say_they_are_per_replica() {
    let redis = "shared_state: { backend: redis, redis: { url: 'redis://10.0.0.5:6379/2', key_prefix: 'a:' } }\nledger: {}\n";
    let budgets = "metering: { budgets: { gw_home: { per_day: 10 } } }\n";
    let e = errors(&format!("{MINIMAL}{redis}{budgets}"));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("/metering: budgets are kept by each replica"),
        "{e:?}"
    );
    let accepted = "metering: { per_replica: true, budgets: { gw_home: { per_day: 10 } } }\n";
    assert!(errors(&format!("{MINIMAL}{redis}{accepted}")).is_empty());
    // One process, or prices without budgets: nothing to say.
    assert!(errors(&format!("{MINIMAL}ledger: {{}}\n{budgets}")).is_empty());
    let prices = "tools: { memory.append: { price: 5 } }\n";
    assert!(errors(&format!("{MINIMAL}{redis}{prices}")).is_empty());
}
