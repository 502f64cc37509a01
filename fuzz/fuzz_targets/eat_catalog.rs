//! EAT catalogs: any bytes are judged without a panic, and a catalog judged valid is a JSON
//! object whose every tool has a unique name and an `x-mcp-tool`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(catalog) = carapace::eat::validate::validate(data) {
        let tools = catalog["tools"].as_array().expect("valid: tools is an array");
        let mut names = std::collections::HashSet::new();
        for t in tools {
            assert!(t.get("x-mcp-tool").is_some());
            assert!(names.insert(t["name"].as_str().expect("valid: a name")));
        }
    }
});
