use base64::Engine as _;
use serde_json::json;

use super::*;

fn receipt() -> Receipt {
    Receipt {
        receipt_id: "rcpt_000102030405060708090a0b".into(),
        tool: "memory.query".into(),
        consumer: "gw_test".into(),
        provider: "memory-host".into(),
        input_hash: value_hash(&json!({"q": "é", "n": 1})),
        output_hash: value_hash(&json!({"hits": []})),
        status: ReceiptStatus::Ok,
        executed_at: rfc3339_ms(1_790_000_000_123),
        duration_ms: 4,
    }
}

fn key() -> SigningIdentity {
    SigningIdentity::from_seed(&[7; 32]).unwrap()
}

#[test]
fn a_signed_receipt_verifies_with_the_signers_key_only() {
    let encoded = receipt().encode(&key());
    assert!(encoded.starts_with("v1."));
    let got = verify(encoded.as_bytes(), &key().public_key_b64()).unwrap();
    assert_eq!(got, receipt());
    let other = SigningIdentity::from_seed(&[8; 32]).unwrap();
    assert_eq!(
        verify(encoded.as_bytes(), &other.public_key_b64()),
        Err(ReceiptError::BadSignature)
    );
    assert_eq!(
        verify(encoded.as_bytes(), "AAAA"),
        Err(ReceiptError::BadKey)
    );
}

#[test]
fn the_payload_is_the_jcs_form_with_sorted_keys() {
    let encoded = receipt().encode(&key());
    let payload = encoded.split('.').nth(1).unwrap();
    let bytes = B64URL.decode(payload).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    assert!(text.starts_with(r#"{"consumer":"gw_test","duration_ms":4,"executed_at":"#));
    assert!(
        text.contains(r#""executed_at":"2026-09-21T14:13:20.123Z""#),
        "{text}"
    );
}

#[test]
fn every_changed_byte_of_the_payload_or_signature_is_refused() {
    let encoded = receipt().encode(&key());
    let public = key().public_key_b64();
    let (payload, sig) = {
        let mut parts = encoded.split('.').skip(1);
        (parts.next().unwrap(), parts.next().unwrap())
    };
    let payload = B64URL.decode(payload).unwrap();
    for i in 0..payload.len() {
        let mut p = payload.clone();
        p[i] ^= 0x01;
        let tampered = format!("v1.{}.{sig}", B64URL.encode(&p));
        assert!(verify(tampered.as_bytes(), &public).is_err(), "byte {i}");
    }
    let sig = B64URL.decode(sig).unwrap();
    for i in 0..sig.len() {
        let mut s = sig.clone();
        s[i] ^= 0x80;
        let tampered = format!("v1.{}.{}", B64URL.encode(&payload), B64URL.encode(&s));
        assert_eq!(
            verify(tampered.as_bytes(), &public),
            Err(ReceiptError::BadSignature),
            "byte {i}"
        );
    }
}

#[test]
fn a_payload_not_in_canonical_form_is_refused_even_when_signed() {
    let r = receipt();
    let pretty = serde_json::to_string_pretty(&r).unwrap();
    let sig = key().sign_bytes(pretty.as_bytes());
    let encoded = format!("v1.{}.{}", B64URL.encode(&pretty), B64URL.encode(sig));
    assert_eq!(
        verify(encoded.as_bytes(), &key().public_key_b64()),
        Err(ReceiptError::NotCanonical)
    );
}

/// A duration no double holds exactly has no RFC 8785 form: such a receipt, signed and in
/// every other way well formed, is refused as not canonical (it once made the check panic).
#[test]
fn a_duration_without_an_rfc_8785_form_is_refused_as_not_canonical() {
    for duration in [(1u64 << 53) + 1, u64::MAX] {
        let r = Receipt {
            duration_ms: duration,
            ..receipt()
        };
        // The form the sender would have had to sign: its integer written out in full.
        let payload = serde_json::to_string(&r).unwrap();
        let sig = key().sign_bytes(payload.as_bytes());
        let encoded = format!("v1.{}.{}", B64URL.encode(&payload), B64URL.encode(sig));
        assert_eq!(
            verify(encoded.as_bytes(), &key().public_key_b64()),
            Err(ReceiptError::NotCanonical)
        );
    }
    // The largest exact one still verifies.
    let r = Receipt {
        duration_ms: 1 << 53,
        ..receipt()
    };
    let encoded = r.encode(&key());
    assert_eq!(verify(encoded.as_bytes(), &key().public_key_b64()), Ok(r));
}

#[test]
fn malformed_values_are_refused_by_form() {
    let public = key().public_key_b64();
    for bad in [
        "".as_bytes(),
        b"v2.a.b",
        b"v1.a",
        b"v1.a.b.c",
        b"v1.!!.AAAA",
        b"v1.e30.AAAA",
        &[0xff, 0xfe],
    ] {
        assert!(
            matches!(verify(bad, &public), Err(ReceiptError::Malformed(_))),
            "{bad:?}"
        );
    }
    let long = vec![b'a'; MAX_ENCODED_BYTES + 1];
    assert!(matches!(decode(&long), Err(ReceiptError::Malformed(_))));
    // A signed document with a field a receipt does not have.
    let extra = json!({"receipt_id": "r", "extra": 1});
    let text = carapace_filters::canonical::jcs_string(&extra).unwrap();
    let sig = key().sign_bytes(text.as_bytes());
    let encoded = format!("v1.{}.{}", B64URL.encode(&text), B64URL.encode(sig));
    assert!(matches!(
        verify(encoded.as_bytes(), &public),
        Err(ReceiptError::Malformed(_))
    ));
}

#[test]
fn the_check_compares_every_field_with_the_call() {
    let encoded = receipt().encode(&key());
    let public = key().public_key_b64();
    let input = json!({"n": 1, "q": "é"});
    let output = json!({"hits": []});
    let want = Expected {
        tool: "memory.query",
        consumer: "gw_test",
        provider: "memory-host",
        input: &input,
        status: ReceiptStatus::Ok,
        output: Some(&output),
        code: None,
    };
    assert!(matches!(
        check(Some(encoded.as_bytes()), &public, &want),
        Verdict::Verified(_)
    ));
    assert_eq!(check(None, &public, &want), Verdict::Missing);
    let other_input = json!({"n": 2, "q": "é"});
    let other_output = json!({"hits": [1]});
    let cases: Vec<(Expected<'_>, &str)> = vec![
        (
            Expected {
                tool: "memory.write",
                ..want
            },
            "tool",
        ),
        (
            Expected {
                consumer: "gw_other",
                ..want
            },
            "consumer",
        ),
        (
            Expected {
                provider: "other-host",
                ..want
            },
            "provider",
        ),
        (
            Expected {
                input: &other_input,
                ..want
            },
            "input_hash",
        ),
        (
            Expected {
                output: Some(&other_output),
                ..want
            },
            "output_hash",
        ),
        (
            Expected {
                status: ReceiptStatus::Error,
                code: Some("X"),
                ..want
            },
            "status",
        ),
    ];
    for (want, field) in cases {
        match check(Some(encoded.as_bytes()), &public, &want) {
            Verdict::Invalid(e) => assert_eq!(e.reason(), field),
            v => panic!("{field}: {v:?}"),
        }
    }
}

#[test]
fn output_hashes_cover_the_output_the_code_or_nothing() {
    let out = json!({"a": 1});
    assert_eq!(
        value_hash(&output_value(ReceiptStatus::Ok, Some(&out), None)),
        value_hash(&json!({"a": 1}))
    );
    assert_eq!(
        output_value(ReceiptStatus::Error, None, Some("FORBIDDEN")),
        json!({"code": "FORBIDDEN"})
    );
    assert_eq!(
        output_value(ReceiptStatus::Timeout, None, None),
        json!(null)
    );
    // sha256 of the three bytes `{}`.
    assert_eq!(
        value_hash(&json!({})),
        "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    );
}

#[test]
fn a_digest_is_tagged_as_sha256_and_lowercase_hex() {
    use sha2::Digest as _;
    let digest: [u8; 32] = sha2::Sha256::digest(b"abc").into();
    assert_eq!(
        super::sha256_tag(&digest),
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        super::value_hash(&serde_json::json!({"b": 1, "a": [true, null]})),
        format!(
            "sha256:{}",
            hex::encode(sha2::Sha256::digest(br#"{"a":[true,null],"b":1}"#))
        )
    );
}

/// The form a receipt signs, as the general RFC 8785 writer gives it for the receipt's JSON.
fn general_jcs(r: &Receipt) -> Option<String> {
    carapace_filters::canonical::jcs_string(&serde_json::to_value(r).unwrap()).ok()
}

#[test]
fn the_member_by_member_form_is_the_general_writers_for_any_strings_and_durations() {
    let strings = [
        "",
        "memory.query",
        "é ü 日本 🦀",
        "quote \" backslash \\ slash /",
        "\u{0}\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1f}\u{7f}",
        "\u{2028}\u{2029}\u{fffd}",
    ];
    let durations = [0, 1, 4, 999, 1 << 32, (1 << 53) - 1, 1 << 53];
    for (i, s) in strings.iter().enumerate() {
        for d in durations {
            let mut r = receipt();
            r.duration_ms = d;
            match i % 3 {
                0 => r.tool = s.to_string(),
                1 => r.consumer = s.to_string(),
                _ => r.provider = s.to_string(),
            }
            r.executed_at = s.to_string();
            r.status = [
                ReceiptStatus::Ok,
                ReceiptStatus::Error,
                ReceiptStatus::Timeout,
            ][i % 3];
            assert_eq!(r.try_canonical(), general_jcs(&r), "{s:?} {d}");
            assert_eq!(decode(r.encode(&key()).as_bytes()).unwrap().receipt, r);
        }
    }
    // Past 2^53 the general writer decides: some integers have a form, others none.
    for d in [(1 << 53) + 1, 1 << 54, 12_345_678_901_234_567_000, u64::MAX] {
        let mut r = receipt();
        r.duration_ms = d;
        assert_eq!(r.try_canonical(), general_jcs(&r), "{d}");
    }
    assert!(general_jcs(&Receipt {
        duration_ms: 1 << 54,
        ..receipt()
    })
    .is_some());
}

#[test]
fn times_are_written_as_go_writes_them_with_milliseconds() {
    let go = |unix_ms: u64| {
        let t = crate::pairing::wire::GoTime::from_unix((unix_ms / 1000) as i64, 0).unwrap();
        let base = t.to_rfc3339_nano().unwrap();
        format!("{}.{:03}Z", base.trim_end_matches('Z'), unix_ms % 1000)
    };
    let mut at = 0u64;
    // A day every 29 from 1970 to 9999 (leap days and the turns of years among them), at a
    // time of day that moves with it.
    while at < 253_402_300_799_999 {
        assert_eq!(rfc3339_ms(at), go(at), "{at}");
        at += 86_400_000 * 29 + 3_723_457;
    }
    assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(rfc3339_ms(951_782_400_001), "2000-02-29T00:00:00.001Z");
    assert_eq!(rfc3339_ms(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
}

#[test]
fn receipt_ids_are_rcpt_and_24_lowercase_hex_digits_each_new() {
    let a = new_receipt_id();
    assert_eq!(a.len(), 29);
    assert!(a.starts_with("rcpt_"));
    assert!(a[5..]
        .bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
    assert_ne!(a, new_receipt_id());
}
