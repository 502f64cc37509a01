//! The connection table: eviction, shares per peer, closing, and the request and head watches.

use super::*;

#[test]
fn at_the_cap_the_oldest_evictable_connection_makes_room() {
    let t = ConnectionTable::new(2, 10);
    let a = t.admit().unwrap();
    let b = t.admit().unwrap();
    b.identify("gw", true).unwrap();
    // `a` (anonymous, idle) is closed for `c`.
    let c = t.admit().unwrap();
    assert_eq!(t.len(), 2);
    assert!(!t.lock().open.contains_key(&a.id));
    // `c` is busy and `b` trusted: nothing can make room.
    let _busy = c.requests().start();
    assert_eq!(t.admit().unwrap_err(), Refused::Full);
    drop(a);
    assert_eq!(t.len(), 2);
    drop(c);
    assert_eq!(t.len(), 1);
}

#[test]
fn only_the_connections_of_peers_no_longer_paired_are_closed() {
    let cert = |fp: &str| {
        Arc::new(PeerCertificate {
            fingerprint: fp.into(),
            gateway_id: None,
            ca_fingerprint: None,
        })
    };
    let t = ConnectionTable::new(10, 10);
    let revoked = t.admit().unwrap();
    revoked.identify_paired("gw_old", cert("old")).unwrap();
    let busy = t.admit().unwrap();
    busy.identify_paired("gw_old", cert("old")).unwrap();
    let _in_flight = busy.requests().start();
    let kept = t.admit().unwrap();
    kept.identify_paired("gw_new", cert("new")).unwrap();
    // A connection without a paired certificate is not one to close here.
    let anonymous = t.admit().unwrap();
    anonymous.identify("10.0.0.1", false).unwrap();
    assert_eq!(t.close_unpaired(|c| c.fingerprint == "new"), 2);
    let open = t.lock().open.keys().copied().collect::<Vec<_>>();
    assert_eq!(open, [kept.id, anonymous.id]);
    // Their places are free: the peer's count went with them.
    assert_eq!(t.lock().per_peer.get("gw_old"), None);
    assert_eq!(t.close_unpaired(|c| c.fingerprint == "new"), 0);
}

#[test]
fn a_peer_holds_at_most_its_share() {
    let t = ConnectionTable::new(10, 2);
    let a = t.admit().unwrap();
    let b = t.admit().unwrap();
    let c = t.admit().unwrap();
    a.identify("10.0.0.1", false).unwrap();
    b.identify("10.0.0.1", false).unwrap();
    assert_eq!(
        c.identify("10.0.0.1", false),
        Err(Refused::PeerFull("10.0.0.1".into()))
    );
    c.identify("10.0.0.2", false).unwrap();
    drop(a);
    let d = t.admit().unwrap();
    d.identify("10.0.0.1", false).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_closes_at_the_first_request_deadline() {
    let t = ConnectionTable::new(4, 4);
    let s = t.admit().unwrap();
    let started = tokio::time::Instant::now();
    s.closing(
        Duration::from_secs(5),
        Duration::from_secs(60),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(started.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_closes_after_its_last_request_but_never_during_one() {
    let t = ConnectionTable::new(4, 4);
    let s = t.admit().unwrap();
    let requests = s.requests();
    let started = tokio::time::Instant::now();
    let closing = s.closing(
        Duration::from_secs(5),
        Duration::from_secs(60),
        Duration::from_secs(5),
    );
    let work = async {
        let g = requests.start();
        // A long call: the connection is busy, not idle, past both deadlines.
        tokio::time::sleep(Duration::from_secs(100)).await;
        drop(g);
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = closing => {}
        _ = work => unreachable!(),
    }
    // Closed 60 s after the call ended (to within the idle poll).
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(160) && took <= Duration::from_millis(160_200),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_keep_alive_connection_waits_the_idle_timeout_but_a_slow_head_only_its_own() {
    let t = ConnectionTable::new(4, 4);
    let s = t.admit().unwrap();
    let requests = s.requests();
    drop(requests.start());
    let started = tokio::time::Instant::now();
    let (first, idle, head) = (
        Duration::from_secs(5),
        Duration::from_secs(60),
        Duration::from_secs(5),
    );
    // Nothing arrives: closed at the idle timeout, not at the head timeout.
    s.closing(first, idle, head).await;
    assert!(started.elapsed() >= idle, "{:?}", started.elapsed());
    // A head begins 20 s into the wait and never completes: closed within twice `head`.
    let s = t.admit().unwrap();
    let requests = s.requests();
    drop(requests.start());
    let started = tokio::time::Instant::now();
    let trickle = async {
        tokio::time::sleep(Duration::from_secs(20)).await;
        requests.bytes_arrived();
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = s.closing(first, idle, head) => {}
        _ = trickle => unreachable!(),
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(25) && took <= Duration::from_secs(30),
        "{took:?}"
    );
}
