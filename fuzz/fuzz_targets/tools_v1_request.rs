//! The tools-v1 `POST /v1/tools/call` body decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;

use carapace::tools_v1::decode_request;

fuzz_target!(|body: &[u8]| {
    match decode_request(body) {
        Ok(req) => {
            for id in [&req.call_id, &req.tool_name] {
                assert!(
                    !id.is_empty() && id.trim() == id.as_str(),
                    "ids are trimmed"
                );
            }
        }
        Err(refused) => {
            // A malformed body yields no ids for the envelope.
            if refused.malformed {
                assert!(refused.call_id.is_empty() && refused.tool_name.is_empty());
            }
        }
    }
});
