//! The pairing messages of every phase, as a WebSocket text frame carries them.
#![no_main]

use libfuzzer_sys::fuzz_target;

use carapace::pairing::wire::{decode_message, PairMessage, SignedMessage, WireMessage};

/// The vectors' gateway key: signatures are checked against it (and fail, unless unchanged).
const GATEWAY_KEY: &str = "zVC52JasYk5Sn5CM3kLhtJbwflO30al6FWMenqVINj0=";

fn wire_of(m: &PairMessage) -> Result<String, carapace::pairing::wire::WireError> {
    match m {
        PairMessage::Init(m) => {
            let _ = m.verify_from_gateway(GATEWAY_KEY);
            let _ = m.verify_with(GATEWAY_KEY);
            m.to_wire()
        }
        PairMessage::Identity(m) => {
            let _ = m.verify_self_signed();
            m.to_wire()
        }
        PairMessage::Challenge(m) => m.to_wire(),
        PairMessage::ChallengeResponse(m) => {
            let _ = m.verify_with(GATEWAY_KEY);
            m.to_wire()
        }
        PairMessage::CsrRequest(m) => {
            let _ = m.verify_with(GATEWAY_KEY);
            m.to_wire()
        }
        PairMessage::CsrIssued(m) => {
            let _ = m.verify_with(GATEWAY_KEY);
            m.to_wire()
        }
        PairMessage::CsrInstalled(m) => {
            let _ = m.verify_with(GATEWAY_KEY);
            m.to_wire()
        }
        PairMessage::Complete(m) => m.to_wire(),
        PairMessage::Error(m) => m.to_wire(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(message) = decode_message(text) else {
        return;
    };
    // What carapace writes back decodes, and writes the same bytes again.
    if let Ok(wire) = wire_of(&message) {
        let again = decode_message(&wire)
            .unwrap_or_else(|e| panic!("written message {wire:?} does not decode: {e}"));
        let rewritten = wire_of(&again).expect("a written message writes again");
        assert_eq!(wire, rewritten, "writing a message is not stable");
    }
});
