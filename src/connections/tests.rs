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

/// A revocation while a connection is admitted: before its slot is the peer's, the sweep of
/// [`ConnectionTable::close_unpaired`] cannot see it, so the second lookup refuses it; after,
/// the sweep closes it.
#[test]
fn a_peer_revoked_while_its_connection_is_admitted_does_not_keep_it() {
    let cert = Arc::new(PeerCertificate {
        fingerprint: "gw".into(),
        gateway_id: None,
        ca_fingerprint: None,
    });
    let t = ConnectionTable::new(10, 10);
    // Paired at the first lookup, revoked (and swept, finding nothing) before the second.
    let lookups = std::cell::Cell::new(0);
    let slot = t.admit().unwrap();
    let revoked_midway = slot.identify_certificate(&cert, "10.0.0.1", |_| {
        lookups.set(lookups.get() + 1);
        if lookups.get() == 1 {
            assert_eq!(t.close_unpaired(|_| true), 0, "nothing paired to sweep yet");
            return Some("gw_test");
        }
        None
    });
    assert_eq!(revoked_midway, Err(Refused::NoLongerPaired));
    assert_eq!(lookups.get(), 2);
    drop(slot);
    // Paired at both lookups, then revoked: the sweep finds it.
    let slot = t.admit().unwrap();
    let held = slot.identify_certificate(&cert, "10.0.0.1", |_| Some("gw_test"));
    assert_eq!(held, Ok(CertificateHolder::Paired));
    assert!(!slot.activity.evictable());
    assert_eq!(t.close_unpaired(|_| false), 1);
    assert!(t.is_empty());
    // A certificate that pairs no one: held by its address, evictable, never swept.
    let stranger = t.admit().unwrap();
    let held = stranger.identify_certificate(&cert, "10.0.0.1", |_| None::<&str>);
    assert_eq!(held, Ok(CertificateHolder::Unpaired));
    assert!(stranger.activity.evictable());
    assert_eq!(t.close_unpaired(|_| false), 0);
    assert_eq!(t.lock().per_peer.get("10.0.0.1"), Some(&1));
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
