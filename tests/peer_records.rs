//! What carapace keeps of paired peers beyond who they are. Their certificates expire: the
//! handshake refuses an expired one and says why, carapace refuses calls once the certificate
//! its record names has expired (by its own clock, also on a connection opened before), and
//! the expiry shows in `peers list`, in a metric and in a warning. Their accepted calls are
//! recorded as `last_seen_at`.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use carapace::client::{tls_config, Client, Transport};
use carapace::pairing::wire::GoTime;
use carapace::pki::Issued;
use common::{call, code, wait_until, Env};
use http::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Log lines written while the guard lives, for the tasks of a current-thread test runtime.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("info")
            .with_ansi(false)
            .with_writer(move || logs.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn rfc3339(t: SystemTime) -> String {
    GoTime::from_system_time(t)
        .and_then(|g| g.to_rfc3339_nano())
        .unwrap()
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Whole seconds (what a certificate holds).
fn whole(t: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(t.duration_since(UNIX_EPOCH).unwrap().as_secs())
}

/// The peer store with one gateway record for `cert`, which says the certificate is valid
/// until `not_after` if given (a record written before carapace kept expiries does not).
fn pair(env: &Env, cert: &Issued, not_after: Option<SystemTime>) {
    let mut record = json!({"component_type": "gateway", "component_id": "gw_test",
        "role": "gateway", "mtls_cert_fingerprint": cert.fingerprint, "status": "active"});
    if let Some(t) = not_after {
        record["mtls_cert_not_after"] = rfc3339(t).into();
    }
    let peers = json!({"version": 1, "peers": [record]});
    std::fs::write(env.path().join("peers.json"), peers.to_string()).unwrap();
}

fn client(env: &Env, r: &carapace::server::Running, cert: &Issued) -> Client {
    Client::new(Transport::Tls {
        address: r.tcp_address.unwrap(),
        config: tls_config(&env.pki.ca.cert_pem(), Some(cert), false),
    })
}

#[tokio::test]
async fn an_expired_paired_certificate_is_refused_at_the_handshake_and_both_ends_are_told_why() {
    let env = Env::new().await;
    let now = whole(SystemTime::now());
    let expired = env
        .pki
        .ca
        .client_valid("gw_test", now - 30 * DAY, now - DAY);
    pair(&env, &expired, None);
    let logs = Logs::default();
    let _guard = logs.capture();
    let r = env.start(&env.tools_yaml("")).await;

    // The caller: the handshake "succeeds" on its side (TLS 1.3), then the first read gets
    // the server's alert, which names the reason.
    let tcp = tokio::net::TcpStream::connect(r.tcp_address.unwrap())
        .await
        .unwrap();
    let config = tls_config(&env.pki.ca.cert_pem(), Some(&expired), false);
    let name = rustls_pki_types::ServerName::from(r.tcp_address.unwrap().ip());
    let outcome = async {
        let mut tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await?;
        tls.write_all(b"GET /v1/tools HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await?;
        let mut buf = Vec::new();
        tls.read_to_end(&mut buf).await.map(|_| buf)
    }
    .await;
    let err = outcome
        .expect_err("an expired certificate was served")
        .to_string();
    assert!(err.contains("CertificateExpired"), "{err}");

    // The operator: the log line names the expiry.
    wait_until(|| logs.text().contains("TLS handshake failed")).await;
    let text = logs.text();
    assert!(text.contains("certificate expired"), "{text}");
    assert!(env.app.received().is_empty());
    r.shutdown().await;
}

#[tokio::test]
async fn a_call_is_refused_once_the_paired_certificate_expired_by_carapace_s_clock() {
    let env = Env::new().await;
    let now = whole(SystemTime::now());
    let not_after = now + 30 * DAY;
    let cert = env.pki.ca.client_valid("gw_test", now - DAY, not_after);
    pair(&env, &cert, Some(not_after));
    let clock = Arc::new(AtomicU64::new(ms(now)));
    let c = clock.clone();
    let r = env
        .start_clocked(
            &env.tools_yaml(""),
            true,
            Arc::new(move || c.load(Ordering::SeqCst)),
        )
        .await;
    let gw = client(&env, &r, &cert);
    let query = call("memory.query", json!({"query": "x"}));
    let reply = gw.post_json("/v1/tools/call", &[], &query).await.unwrap();
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());

    // The certificate's last valid second, then the one after.
    clock.store(ms(not_after), Ordering::SeqCst);
    let reply = gw.post_json("/v1/tools/call", &[], &query).await.unwrap();
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    clock.store(ms(not_after) + 1_000, Ordering::SeqCst);
    let reply = gw.post_json("/v1/tools/call", &[], &query).await.unwrap();
    assert_eq!(code(&reply), "FORBIDDEN", "{:?}", reply.json());
    let message = reply.json()["error"]["message"].to_string();
    assert!(
        message.contains("certificate") && message.contains("expired"),
        "{message}"
    );
    let list = gw.send(Method::GET, "/v1/tools", &[], "").await.unwrap();
    assert_eq!(code(&list), "FORBIDDEN");
    assert_eq!(env.app.received().len(), 2);
    r.shutdown().await;
}

#[tokio::test]
async fn certificate_expiry_shows_in_peers_list_in_a_metric_and_in_a_warning() {
    let env = Env::new().await;
    let now = whole(SystemTime::now());
    let not_after = now + 10 * DAY + Duration::from_secs(3600);
    let cert = env.pki.ca.client_valid("gw_test", now - DAY, not_after);
    pair(&env, &cert, Some(not_after));
    let logs = Logs::default();
    let _guard = logs.capture();
    let at = ms(now);
    let r = env
        .start_clocked(&env.tools_yaml(""), true, Arc::new(move || at))
        .await;

    let (_, peers) = carapace::admin::request(&r.admin_socket, Method::GET, "/v1/peers", None)
        .await
        .unwrap();
    assert_eq!(
        peers["peers"][0]["mtls_cert_not_after"],
        rfc3339(not_after).as_str()
    );

    // Days to expiry, refreshed by the housekeeping task.
    let gauge = "carapace_peer_certificate_expiry_days{component_id=\"gw_test\"} 10";
    wait_until(|| r.shared.metrics.encode().contains(gauge)).await;
    wait_until(|| logs.text().contains("peer_certificate_expiring")).await;
    assert!(
        logs.text()
            .contains("peer_certificate_expiring component_id=gw_test days=10"),
        "{}",
        logs.text()
    );
    r.shutdown().await;
}

#[tokio::test]
async fn an_accepted_call_is_recorded_as_last_seen_and_a_refused_one_is_not() {
    let env = Env::new().await;
    let peers = json!({"version": 1, "peers": [
        {"component_type": "gateway", "component_id": "gw_test",
         "mtls_cert_fingerprint": env.pki.gateway.fingerprint, "status": "active"},
        {"component_type": "subscriber", "component_id": "sub_1",
         "mtls_cert_fingerprint": env.pki.stranger.fingerprint, "status": "active"}
    ]});
    let path = env.path().join("peers.json");
    std::fs::write(&path, peers.to_string()).unwrap();
    let at = ms(whole(SystemTime::now()));
    let r = env
        .start_clocked(&env.tools_yaml(""), true, Arc::new(move || at))
        .await;
    let query = call("memory.query", json!({"query": "x"}));
    let sub = client(&env, &r, &env.pki.stranger);
    let reply = sub.post_json("/v1/tools/call", &[], &query).await.unwrap();
    assert_eq!(code(&reply), "FORBIDDEN");
    let gw = env.gateway(&r);
    for _ in 0..5 {
        let reply = gw.post_json("/v1/tools/call", &[], &query).await.unwrap();
        assert_eq!(reply.json()["status"], "ok");
    }
    // Written by the housekeeping task, with the time of the call.
    let record = |id: &str| {
        let file: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        file["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["component_id"] == id)
            .cloned()
            .unwrap()
    };
    let expected = rfc3339(UNIX_EPOCH + Duration::from_millis(at));
    wait_until(|| record("gw_test")["last_seen_at"] == expected.as_str()).await;
    assert!(record("sub_1")["last_seen_at"].is_null());
    r.shutdown().await;
}
