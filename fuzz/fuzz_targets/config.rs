//! The configuration file (YAML), validated as `carapace check` does.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match carapace::config::parse(text, Path::new("/nonexistent/carapace-fuzz")) {
        Ok(_) => {}
        Err(errors) => assert!(!errors.0.is_empty(), "a refused file names an error"),
    }
});
