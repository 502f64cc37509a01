//! The caller-tool relay's messages: any JSON as a declaration (caller id and tools with
//! their input schemas) and as an answer is judged without a panic; a declaration taken puts
//! exactly its tools in the catalog, under `<caller_id>_<name>`, and withdraws them when its
//! stream ends; an answer for no open stream is never taken.

#![no_main]

use std::sync::Arc;

use carapace::catalog::CatalogHandle;
use carapace::config::CallerToolsConfig;
use carapace::relay::registry::{CallerTools, Declared};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let catalog = Arc::new(CatalogHandle::default());
    let relay = CallerTools::new(CallerToolsConfig::default(), catalog.clone());
    assert!(carapace::relay::endpoint::answer(&relay, "local", doc.clone()).is_err());
    let caller = doc.get("caller_id").and_then(|c| c.as_str()).unwrap_or("fuzz");
    let Some(tools) = doc
        .get("tools")
        .cloned()
        .and_then(|t| serde_json::from_value::<Vec<Declared>>(t).ok())
    else {
        return;
    };
    let names: Vec<String> = tools.iter().map(|t| format!("{caller}_{}", t.name)).collect();
    if let Ok((_events, guard)) = relay.register("local", caller, tools) {
        let served = catalog.load();
        assert_eq!(served.tools.len(), names.len());
        for n in &names {
            assert!(served.tools.contains_key(n), "{n}");
        }
        drop(guard);
        assert!(catalog.load().tools.is_empty());
    }
});
