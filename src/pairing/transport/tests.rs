use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use carapace_filters::nonce::NonceStore;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::dial::{pair, parse_endpoint, Ending};
use super::endpoint::{PairingEndpoint, PairingSink};
use super::*;
/// Largest pairing message accepted (as crabstack: 64 KiB).
use super::{next_text, PairingError};
use crate::pairing::handshake::{
    GatewayHandshake, HandshakeError, Installed, PairRequest, Progress, RemoteConfig,
};
use crate::pairing::identity::{GatewayIdentity, HostIdentity};

#[test]
fn plain_websocket_only_to_loopback() {
    assert!(parse_endpoint("ws://127.0.0.1:7444/v1/pair").is_ok());
    assert!(parse_endpoint("ws://localhost:7444").is_ok());
    assert!(parse_endpoint("ws://[::1]:7444/v1/pair").is_ok());
    let v6 = parse_endpoint("ws://[::1]/v1/pair").unwrap();
    assert_eq!((v6.host.as_str(), v6.port), ("::1", 80));
    assert!(matches!(
        parse_endpoint("ws://10.0.0.1:5225"),
        Err(PairingError::InsecureEndpoint(_))
    ));
    assert!(matches!(
        parse_endpoint("http://127.0.0.1:1"),
        Err(PairingError::InvalidRequest(_))
    ));
    let e = parse_endpoint("wss://10.0.0.1:5225/v1/pair").unwrap();
    assert!(e.secure);
    assert_eq!((e.port, e.path.as_str()), (5225, "/v1/pair"));
}

#[derive(Default)]
struct Counting {
    installed: AtomicUsize,
    activated: AtomicUsize,
    abandoned: AtomicUsize,
    /// Activation fails (as when the listener's new TLS cannot be built).
    refuse_activation: std::sync::atomic::AtomicBool,
    /// Installing takes this long (ms), holding the pairing.
    install_ms: std::sync::atomic::AtomicU64,
}

impl PairingSink for Counting {
    fn install(&self, _: &Installed) -> Result<(), String> {
        let ms = self.install_ms.load(Ordering::SeqCst);
        if ms > 0 {
            // The endpoint's other connections go on meanwhile (a multi-thread runtime).
            tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(ms)));
        }
        self.installed.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn activate(&self, _: &Installed) -> Result<(), String> {
        assert_eq!(
            self.installed.load(Ordering::SeqCst),
            1,
            "activated before install"
        );
        if self.refuse_activation.load(Ordering::SeqCst) {
            return Err("no TLS listener".into());
        }
        self.activated.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn abandon(&self, _: &str) {
        self.abandoned.fetch_add(1, Ordering::SeqCst);
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    gateway: Arc<GatewayIdentity>,
    sink: Arc<Counting>,
    url: String,
    _stop: watch::Sender<bool>,
}

async fn setup() -> Setup {
    setup_with(None).await
}

/// `tls`: serve wss:// with this certificate; `Some((_, wrong))` makes the endpoint claim
/// another fingerprint in `pair.identity`.
async fn setup_with(tls: Option<(crate::pki::Issued, bool)>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let gateway =
        Arc::new(GatewayIdentity::load_or_create(&dir.path().join("gw"), "gw_t").unwrap());
    let host = Arc::new(HostIdentity::load_or_create(&dir.path().join("host")).unwrap());
    let sink = Arc::new(Counting::default());
    let nonces = NonceStore::open(
        carapace_filters::nonce::NonceStoreConfig {
            capacity: 16,
            ttl: Duration::from_secs(600),
            journal: None,
        },
        0,
    )
    .unwrap();
    let mut endpoint = PairingEndpoint::new(
        RemoteConfig {
            component_type: "tool_host".into(),
            component_id: "memory-east".into(),
            gateway_public_key_ed25519: gateway.public_key_ed25519(),
            endpoint_tls_fingerprint: String::new(),
        },
        host,
        Arc::new(nonces),
        "/v1/pair".into(),
        sink.clone(),
    );
    endpoint.step_timeout = Duration::from_millis(300);
    let scheme = if tls.is_some() { "wss" } else { "ws" };
    if let Some((cert, wrong)) = tls {
        use rustls_pki_types::pem::PemObject;
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap();
        endpoint = endpoint.with_tls(vec![cert.der.clone()], key).unwrap();
        if wrong {
            endpoint.config.endpoint_tls_fingerprint = format!("sha256:{}", "0".repeat(64));
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("{scheme}://{}/v1/pair", listener.local_addr().unwrap());
    let (stop, stop_rx) = watch::channel(false);
    tokio::spawn(Arc::new(endpoint).serve(listener, stop_rx));
    Setup {
        _dir: dir,
        gateway,
        sink,
        url,
        _stop: stop,
    }
}

fn request(url: &str) -> PairRequest {
    PairRequest {
        component_type: "tool_host".into(),
        component_id: "memory-east".into(),
        endpoint: url.into(),
    }
}

async fn raw(url: &str) -> WebSocketStream<TcpStream> {
    let addr = url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let tcp = TcpStream::connect(addr).await.unwrap();
    tokio_tungstenite::client_async(url, tcp).await.unwrap().0
}

/// The endpoint ends the connection (close frame, error or EOF) within a bounded time.
async fn assert_closed(ws: &mut WebSocketStream<TcpStream>) {
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => continue,
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the endpoint kept the connection open");
}

#[tokio::test]
async fn a_pairing_over_websocket_installs_before_confirming() {
    let s = setup().await;
    let done = pair(s.gateway.clone(), request(&s.url), Box::new(|_| Ok(())))
        .await
        .unwrap();
    assert_eq!(done.peer.component_id, "memory-east");
    // The tool host closes once it has activated: the gateway saw it.
    assert_eq!(done.ending, Ending::Closed);
    assert_eq!(s.sink.installed.load(Ordering::SeqCst), 1);
    assert_eq!(s.sink.activated.load(Ordering::SeqCst), 1);
    assert_eq!(s.sink.abandoned.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_tool_host_that_cannot_activate_says_so_after_pair_complete() {
    let s = setup().await;
    s.sink.refuse_activation.store(true, Ordering::SeqCst);
    let done = pair(s.gateway.clone(), request(&s.url), Box::new(|_| Ok(())))
        .await
        .unwrap();
    assert!(
        matches!(&done.ending, Ending::Refused(why) if why.contains("HANDSHAKE_FAILED")),
        "{:?}",
        done.ending
    );
    assert_eq!(s.sink.activated.load(Ordering::SeqCst), 0);
    assert_eq!(s.sink.abandoned.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn over_wss_the_identity_must_name_the_certificate_the_gateway_saw() {
    let ca = crate::pki::Authority::new("pairing endpoint CA");
    let s = setup_with(Some((ca.server(&["127.0.0.1"]), false))).await;
    assert!(s.url.starts_with("wss://"));
    let done = pair(s.gateway.clone(), request(&s.url), Box::new(|_| Ok(())))
        .await
        .unwrap();
    assert_eq!(done.peer.component_id, "memory-east");
    assert_eq!(s.sink.activated.load(Ordering::SeqCst), 1);

    let s = setup_with(Some((ca.server(&["127.0.0.1"]), true))).await;
    let err = pair(s.gateway.clone(), request(&s.url), Box::new(|_| Ok(())))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            PairingError::Handshake(HandshakeError::FingerprintMismatch)
        ),
        "{err}"
    );
    assert_eq!(s.sink.installed.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_oversized_frame_a_silent_peer_and_a_wrong_path_are_cut_off() {
    let s = setup().await;
    let mut ws = raw(&s.url).await;
    let _ = ws
        .send(Message::text("x".repeat(MAX_MESSAGE_BYTES + 1)))
        .await;
    assert_closed(&mut ws).await;
    let mut silent = raw(&s.url).await;
    assert_closed(&mut silent).await;
    let addr = s
        .url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let wrong = s.url.replace("/v1/pair", "/v1/other");
    assert!(tokio_tungstenite::client_async(wrong, tcp).await.is_err());
    assert_eq!(s.sink.installed.load(Ordering::SeqCst), 0);
    // The endpoint still pairs afterwards.
    pair(s.gateway.clone(), request(&s.url), Box::new(|_| Ok(())))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_gateway_that_stops_at_any_step_leaves_no_peer_activated() {
    // Stop after the gateway has sent 1 (init), 2 (+challenge), 3 (+csr_issued) messages.
    for stop_after in 1..=3 {
        let s = setup().await;
        let mut ws = raw(&s.url).await;
        let (mut hs, init) =
            GatewayHandshake::start(s.gateway.clone(), request(&s.url), None, SystemTime::now())
                .unwrap();
        let mut sent = 1;
        ws.send(Message::text(init)).await.unwrap();
        while sent < stop_after {
            let text = next_text(&mut ws, Duration::from_secs(5)).await.unwrap();
            if let Progress::Continue(out) = hs.on_message(&text, SystemTime::now()).unwrap() {
                for m in out {
                    ws.send(Message::text(m)).await.unwrap();
                    sent += 1;
                }
            }
        }
        drop(ws);
        // Give the endpoint time to notice, then check nothing was activated.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            s.sink.activated.load(Ordering::SeqCst),
            0,
            "stopped after {stop_after} messages"
        );
        let installed = s.sink.installed.load(Ordering::SeqCst);
        assert_eq!(
            installed,
            usize::from(stop_after == 3),
            "after {stop_after}"
        );
        // What was installed is removed again.
        assert_eq!(s.sink.abandoned.load(Ordering::SeqCst), installed);
    }
}

/// A connection that upgrades and says nothing does not hold the tool host's one pairing: a
/// gateway pairs while it is still open.
#[tokio::test]
async fn a_silent_connection_does_not_keep_a_gateway_from_pairing() {
    let s = setup().await;
    let mut silent = raw(&s.url).await;
    pair(s.gateway.clone(), request(&s.url), Box::new(|_| Ok(())))
        .await
        .unwrap();
    assert_eq!(s.sink.installed.load(Ordering::SeqCst), 1);
    assert_closed(&mut silent).await;
}

/// Connections from one address that send nothing hold at most its share of the endpoint's
/// places: a gateway elsewhere still pairs while they are open.
#[tokio::test]
async fn silent_connections_from_one_address_leave_places_for_a_gateway() {
    let s = setup().await;
    let addr: std::net::SocketAddr = s
        .url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut silent = Vec::new();
    for _ in 0..MAX_PAIRING_CONNECTIONS {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        silent.push(socket.connect(addr).await.unwrap());
    }
    // Past its share, the address's connections are closed at once (the others are held
    // for a step, 300 ms here).
    let ended = futures_util::future::join_all(silent.iter_mut().map(|c| async move {
        use tokio::io::AsyncReadExt;
        let mut b = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(150), c.read(&mut b)).await;
        matches!(read, Ok(Ok(0)) | Ok(Err(_)))
    }))
    .await;
    let closed = ended.iter().filter(|e| **e).count();
    assert_eq!(
        closed,
        MAX_PAIRING_CONNECTIONS - MAX_PAIRING_CONNECTIONS_PER_ADDRESS
    );
    pair(s.gateway.clone(), request(&s.url), Box::new(|_| Ok(())))
        .await
        .unwrap();
    assert_eq!(s.sink.installed.load(Ordering::SeqCst), 1);
}

/// Two verified pairings at once: the second is refused with the protocol's `pair.error`
/// while the first runs, and the first completes; one pairing is installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_verified_pairing_is_refused_while_the_first_runs() {
    let s = setup().await;
    s.sink.install_ms.store(250, Ordering::SeqCst);
    let first = tokio::spawn(pair(
        s.gateway.clone(),
        request(&s.url),
        Box::new(|_| Ok(())),
    ));
    // The first is inside its install (250 ms) when the second's `pair.init` arrives.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = pair(s.gateway.clone(), request(&s.url), Box::new(|_| Ok(()))).await;
    let refused = second.expect_err("the second pairing ran beside the first");
    assert!(
        refused.to_string().contains("a pairing is already running"),
        "{refused}"
    );
    first.await.unwrap().expect("the first pairing completes");
    assert_eq!(s.sink.installed.load(Ordering::SeqCst), 1);
    assert_eq!(s.sink.activated.load(Ordering::SeqCst), 1);
}
