//! The EAT discovery client's OpenAPI reader: any JSON is judged without a panic, and an
//! operation it takes has a name and an object input schema without document references.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(op) = carapace::eat::openapi::operation(&doc) {
        assert!(!op.operation_id.is_empty());
        assert!(op.input.is_object());
        assert!(!op.input.to_string().contains("\"#/components"));
    }
});
