//! The app's HTTP/1.1 answer as carapace reads it (the head, its framing headers, chunked
//! bodies and their trailers): whatever the app writes, nothing panics, a body is never over
//! the bound, and the answer read depends neither on how the bytes were split into reads nor
//! on whether its headers are kept.
//!
//! Input: one byte choosing the read size (0: all at once), one byte choosing the body bound
//! (times 16), then the answer's bytes.

#![no_main]

use carapace::upstream::read_answer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [step, bound, answer @ ..] = data else {
        return;
    };
    let max = usize::from(*bound) * 16;
    let whole = read_answer(answer, 0, max, true);
    let pieces = read_answer(answer, usize::from(*step % 17), max, false);
    if let Ok((_, body)) = &whole {
        assert!(body.len() <= max);
    }
    // Read whole, the first error may be found further on than in pieces; an answer accepted
    // either way is the same answer.
    match (&whole, &pieces) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the same answer split into reads differs"),
        (Ok(_), Err(e)) | (Err(e), Ok(_)) => {
            panic!("accepted one way, refused the other: {e}")
        }
        (Err(_), Err(_)) => {}
    }
});
