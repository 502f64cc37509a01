//! The peer store file.
#![no_main]

use libfuzzer_sys::fuzz_target;

use carapace::peers::PeerStore;

fuzz_target!(|bytes: &[u8]| {
    let Ok(store) = PeerStore::from_bytes("/nonexistent/carapace-fuzz/peers.json", bytes) else {
        return;
    };
    let records = store.records();
    assert_eq!(records.len(), store.len());
    for r in &records {
        let _ = store.active(&r.component_id);
        let _ = store.status_of(&r.component_id);
    }
    let _ = store.certificate_expiry_days(1_767_225_600_000);
});
