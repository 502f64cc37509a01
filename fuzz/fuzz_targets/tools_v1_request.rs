//! The tools-v1 `POST /v1/tools/call` body decoder: the one-pass reader and the general
//! decoding (strict parse and the seed's schema) give the same result on every body.
#![no_main]

use libfuzzer_sys::fuzz_target;

use carapace::tools_v1::{decode_request, decode_request_general};

fuzz_target!(|body: &[u8]| {
    let decoded = decode_request(body);
    assert_eq!(
        format!("{decoded:?}"),
        format!("{:?}", decode_request_general(body)),
        "the one-pass reader and the general decoding differ"
    );
    match decoded {
        Ok(req) => {
            for id in [&*req.call_id, &*req.tool_name] {
                assert!(!id.is_empty() && id.trim() == id, "ids are trimmed");
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
