//! The admin socket: only this process's user (or root) may use it, and a malformed or
//! oversized request changes nothing.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;

use common::Env;
use http::{Method, StatusCode};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The kill-switch state and the peer store, as the admin API shows them.
async fn admin_state(sock: &Path) -> (serde_json::Value, serde_json::Value) {
    let (_, ks) = carapace::admin::request(sock, Method::GET, "/v1/kill-switch", None)
        .await
        .unwrap();
    let (_, peers) = carapace::admin::request(sock, Method::GET, "/v1/peers", None)
        .await
        .unwrap();
    (ks, peers)
}

/// Send raw bytes on the admin socket; what came back (empty if the connection was closed).
async fn raw(sock: &Path, bytes: &[u8]) -> String {
    let mut s = tokio::net::UnixStream::connect(sock).await.unwrap();
    let _ = s.write_all(bytes).await;
    let _ = s.shutdown().await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).to_string()
}

#[tokio::test]
async fn the_admin_socket_is_private_and_refuses_bad_requests_without_effect() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("")).await;
    let sock = r.admin_socket.clone();
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let before = admin_state(&sock).await;

    let bad_bodies: [(&str, &str, Vec<u8>); 5] = [
        ("PUT", "/v1/kill-switch", b"{\"engaged\": tru".to_vec()),
        (
            "PUT",
            "/v1/kill-switch",
            b"{\"engaged\": true, \"x\": 1}".to_vec(),
        ),
        ("PUT", "/v1/kill-switch", b"[true]".to_vec()),
        (
            "POST",
            "/v1/peers/revoke",
            b"{\"component_id\": 7}".to_vec(),
        ),
        (
            "PUT",
            "/v1/kill-switch",
            format!(
                "{{\"engaged\": true, \"tool\": \"{}\"}}",
                "a".repeat(100 * 1024)
            )
            .into_bytes(),
        ),
    ];
    for (method, path, body) in bad_bodies {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let mut req = head.into_bytes();
        req.extend_from_slice(&body);
        let answer = raw(&sock, &req).await;
        assert!(
            answer.starts_with("HTTP/1.1 400"),
            "{method} {path} ({} bytes): {answer}",
            body.len()
        );
    }
    // A head far beyond the limit, and bytes that are not HTTP: closed or refused.
    let huge = format!(
        "GET /v1/kill-switch HTTP/1.1\r\nhost: x\r\nx-pad: {}\r\n\r\n",
        "p".repeat(64 * 1024)
    );
    let answer = raw(&sock, huge.as_bytes()).await;
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
    let answer = raw(&sock, b"\x16\x03\x01\x00\x05hello\r\n\r\n").await;
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");

    assert_eq!(
        admin_state(&sock).await,
        before,
        "a refused request had an effect"
    );
    // The socket still works.
    let (status, _) = carapace::admin::request(
        &sock,
        Method::PUT,
        "/v1/kill-switch",
        Some(json!({"engaged": true, "tool": "memory.delete"})),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    r.shutdown().await;
}

#[test]
fn only_the_same_user_or_root_may_use_the_admin_socket() {
    assert!(carapace::admin::peer_allowed(1000, 1000));
    assert!(carapace::admin::peer_allowed(0, 1000));
    assert!(!carapace::admin::peer_allowed(1001, 1000));
    assert!(!carapace::admin::peer_allowed(65534, 0));
}

/// Another user is turned away even when the socket's mode would let it in. Needs root to
/// run a client as another user; elsewhere the unit test above covers the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_is_refused_even_through_a_loosened_mode() {
    if carapace::admin::effective_uid().unwrap() != 0 {
        eprintln!("not root: cannot start a client as another user");
        return;
    }
    let env = Env::new().await;
    let dir = env.path().to_path_buf();
    let yaml = env.tools_yaml(&format!(
        "admin: {{ socket: {}/admin.sock }}",
        dir.display()
    ));
    let r = env.start(&yaml).await;
    let sock = r.admin_socket.clone();
    // Let anyone reach and open the socket.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let curl = |uid: Option<u32>| {
        let sock = sock.clone();
        move || {
            let mut c = std::process::Command::new("curl");
            c.args(["-sS", "--max-time", "10", "--unix-socket"])
                .arg(&sock)
                .arg("http://localhost/v1/kill-switch");
            if let Some(uid) = uid {
                c.uid(uid).gid(uid);
            }
            c.output().unwrap()
        }
    };
    let as_root = tokio::task::spawn_blocking(curl(None)).await.unwrap();
    assert!(
        String::from_utf8_lossy(&as_root.stdout).contains("global_engaged"),
        "{as_root:?}"
    );
    let as_nobody = tokio::task::spawn_blocking(curl(Some(65534)))
        .await
        .unwrap();
    assert!(!as_nobody.status.success(), "{as_nobody:?}");
    assert!(
        !String::from_utf8_lossy(&as_nobody.stdout).contains("global_engaged"),
        "{as_nobody:?}"
    );
    r.shutdown().await;
}
