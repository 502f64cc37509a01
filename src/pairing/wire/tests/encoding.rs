//! Go JSON string encoding and RFC 3339 times.

use super::*;

#[test]
fn json_encoding_vectors() {
    let t = transcript();
    let gw = gateway_identity(&t);
    let rm = remote_identity(&t);
    let e = load("json_encoding.json");
    let vectors = e["vectors"].as_array().unwrap();
    assert_eq!(vectors.len(), 12);
    let mut checked = 0;
    for v in vectors {
        let id = s(v, "id");
        let wire = s(v, "wire_text");
        let sb = s(v, "signed_bytes_b64");
        assert_eq!(b64(sb), s(v, "signed_bytes_text").as_bytes(), "{id}");
        let (key, signer) = if s(v, "signer") == "gateway" {
            (gw.public_key_b64(), &gw)
        } else {
            (rm.public_key_b64(), &rm)
        };
        // The Go string encoder on the raw input reproduces the escaped value inside
        // the signed bytes (this is the only way to feed it invalid UTF-8).
        if let Some(input) = v.get("input_value_utf8_hex").and_then(Value::as_str) {
            let mut encoded = b"\"component_id\":".to_vec();
            append_go_json_string(&mut encoded, &hex::decode(input).unwrap());
            let signed = b64(sb);
            assert!(
                signed
                    .windows(encoded.len())
                    .any(|w| w == encoded.as_slice()),
                "{id}: encoder output {:?} not in signed bytes",
                String::from_utf8_lossy(&encoded)
            );
        }
        if !v["go_receiver_verifies_wire"].as_bool().unwrap() {
            // escape.invalid_utf8: the wire carries \ufffd, which decodes to U+FFFD and
            // re-encodes raw, so a receiver cannot verify — exactly like a Go receiver.
            assert_eq!(id, "escape.invalid_utf8");
            let msg = PairIdentity::from_wire(wire).unwrap();
            assert_eq!(msg.remote.component_id, "bad\u{fffd}byte");
            let ours = msg.signed_bytes().unwrap();
            assert_ne!(ours, b64(sb));
            assert!(ours.windows(3).any(|w| w == [0xef, 0xbf, 0xbd]));
            assert!(matches!(
                msg.verify_with(&key),
                Err(WireError::BadSignature)
            ));
            // Go's json/v2-backed encoder writes the raw form, which is what we sign.
            let mut resigned = msg.clone();
            resigned.sign_with(signer).unwrap();
            resigned.verify_with(&key).unwrap();
            checked += 1;
            continue;
        }
        match wire {
            w if w.starts_with("{\"type\":\"pair.identity\"") => {
                check_signed::<PairIdentity>(w, sb, &key, Some(signer));
            }
            w if w.starts_with("{\"type\":\"pair.init\"") => {
                check_signed::<PairInit>(w, sb, &key, Some(signer));
            }
            w if w.starts_with("{\"type\":\"pair.csr_issued\"") => {
                let m = check_signed::<PairCsrIssued>(w, sb, &key, Some(signer));
                assert!(m.not_before.ends_with("+02:00"));
                assert!(
                    s(v, "signed_bytes_text").contains("\"not_before\":\"2026-01-02T02:59:05Z\"")
                );
            }
            _ => panic!("{id}: unexpected message"),
        }
        checked += 1;
    }
    assert_eq!(checked, 12);
}

#[test]
fn go_string_escaping() {
    let cases: &[(&[u8], &str)] = &[
        (b"plain", "\"plain\""),
        (b"<a&b>", "\"\\u003ca\\u0026b\\u003e\""),
        (b"q\"b\\s/x", "\"q\\\"b\\\\s/x\""),
        (
            b"\x00\x01\x08\x0c\x0a\x0d\x09\x1f\x7f",
            "\"\\u0000\\u0001\\b\\f\\n\\r\\t\\u001f\x7f\"",
        ),
        ("a\u{2028}b\u{2029}c".as_bytes(), "\"a\\u2028b\\u2029c\""),
        ("café-🦀-ü\u{fffd}".as_bytes(), "\"café-🦀-ü\u{fffd}\""),
        (b"bad\xffbyte", "\"bad\\ufffdbyte\""),
        (b"\xe2\x82x", "\"\\ufffd\\ufffdx\""),
        (b"\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\""),
        (b"+/=", "\"+/=\""),
    ];
    for (input, expected) in cases {
        let mut out = Vec::new();
        append_go_json_string(&mut out, input);
        assert_eq!(String::from_utf8(out).unwrap(), *expected, "{input:?}");
    }
    assert_eq!(
        go_json_string("-----BEGIN X-----\nAB+/=\n"),
        "\"-----BEGIN X-----\\nAB+/=\\n\""
    );
}

#[test]
fn rfc3339_parse_and_format_like_go() {
    let canon = |s: &str| GoTime::parse_rfc3339(s).and_then(|t| t.to_rfc3339_nano());
    let utc = |s: &str| GoTime::parse_rfc3339(s).and_then(|t| t.to_utc().to_rfc3339_nano());
    for (input, expected) in [
        (
            "2026-01-02T03:04:05.1234567Z",
            "2026-01-02T03:04:05.1234567Z",
        ),
        (
            "2026-01-02T03:04:05.123456700Z",
            "2026-01-02T03:04:05.1234567Z",
        ),
        ("2026-01-02T03:04:05.000000000Z", "2026-01-02T03:04:05Z"),
        (
            "2026-01-02T03:04:05.000000001Z",
            "2026-01-02T03:04:05.000000001Z",
        ),
        (
            "2026-01-02T03:04:05.1234567891999Z",
            "2026-01-02T03:04:05.123456789Z",
        ),
        ("2026-01-02T05:04:05+02:00", "2026-01-02T05:04:05+02:00"),
        ("2026-01-02T05:04:05-00:00", "2026-01-02T05:04:05Z"),
        ("2026-01-02T05:04:05+00:00", "2026-01-02T05:04:05Z"),
        ("2024-02-29T00:00:00Z", "2024-02-29T00:00:00Z"),
        ("0000-01-01T00:00:00Z", "0000-01-01T00:00:00Z"),
    ] {
        assert_eq!(canon(input).as_deref(), Some(expected), "{input}");
    }
    for bad in [
        "",
        "2026-01-02",
        "2026-01-02T03:04:05",
        "2026-01-02t03:04:05Z",
        "2026-01-02T03:04:05z",
        "2026-01-02 03:04:05Z",
        "2026-01-02T3:04:05Z",
        "2026-01-02T03:04:05,1Z",
        "2026-01-02T03:04:05.Z",
        "2026-01-02T24:00:00Z",
        "2026-01-02T03:60:00Z",
        "2026-01-02T03:04:60Z",
        "2026-13-02T03:04:05Z",
        "2026-00-02T03:04:05Z",
        "2025-02-29T03:04:05Z",
        "2026-04-31T03:04:05Z",
        "2026-01-02T03:04:05+24:00",
        "2026-01-02T03:04:05+02:60",
        "2026-01-02T03:04:05+0200",
        "2026-01-02T03:04:05Z ",
        "+2026-01-02T03:04:05Z",
        "2026-01-02T03:04:05.1é",
        "２026-01-02T03:04:05Z",
    ] {
        assert_eq!(GoTime::parse_rfc3339(bad), None, "{bad:?}");
    }
    // UTC conversion across day, month and year boundaries.
    assert_eq!(
        utc("2026-01-02T04:59:05+02:00").as_deref(),
        Some("2026-01-02T02:59:05Z")
    );
    assert_eq!(
        utc("2026-01-01T01:00:00+02:00").as_deref(),
        Some("2025-12-31T23:00:00Z")
    );
    assert_eq!(
        utc("2024-02-28T23:30:00.5-01:00").as_deref(),
        Some("2024-02-29T00:30:00.5Z")
    );
    assert_eq!(utc("9999-12-31T23:59:59-00:01"), None);
    assert_eq!(utc("0000-01-01T00:00:00+00:01"), None);
    // Unix conversions.
    let t = GoTime::parse_rfc3339("2026-01-02T03:04:05.1234567Z").unwrap();
    assert_eq!(t.unix_timestamp(), (1_767_323_045, 123_456_700));
    assert_eq!(GoTime::from_unix(1_767_323_045, 123_456_700), Some(t));
    assert_eq!(
        GoTime::from_system_time(t.to_system_time().unwrap()),
        Some(t)
    );
    let old = GoTime::parse_rfc3339("1969-12-31T23:59:59.25Z").unwrap();
    assert_eq!(old.unix_timestamp(), (-1, 250_000_000));
    assert_eq!(
        GoTime::from_system_time(old.to_system_time().unwrap()),
        Some(old)
    );
    assert_eq!(
        GoTime::from_unix(0, 0).unwrap().to_string(),
        "1970-01-01T00:00:00Z"
    );
    let offset = GoTime::parse_rfc3339("2026-01-02T05:04:05-07:30").unwrap();
    assert_eq!(offset.offset_seconds(), -27_000);
    assert_eq!(offset.to_utc().unix_timestamp(), offset.unix_timestamp());
}

#[test]
fn days_round_trip_over_a_wide_range() {
    for days in (-800_000..800_000).step_by(97) {
        let (y, m, d) = civil_from_days(days);
        assert!((1..=12).contains(&m) && d >= 1 && d <= days_in_month(y, m));
        assert_eq!(days_from_civil(y, m, d), days);
    }
    assert_eq!(days_from_civil(1970, 1, 1), 0);
    assert_eq!(days_from_civil(2000, 3, 1), 11_017);
}

#[test]
fn bad_times_make_signing_and_verifying_fail() {
    let t = transcript();
    let gw = gateway_identity(&t);
    let wire = s(&t["messages"][0], "wire_text");
    let mut init = PairInit::from_wire(wire).unwrap();
    init.gateway.issued_at = "2026-01-02 03:04:05Z".into();
    assert!(matches!(
        init.verify_with(&gw.public_key_b64()),
        Err(WireError::BadTime {
            field: "gateway.issued_at",
            ..
        })
    ));
    assert!(matches!(
        init.sign_with(&gw),
        Err(WireError::BadTime { .. })
    ));
    assert!(init.to_wire().is_err());
    init.gateway.issued_at = String::new();
    assert!(matches!(
        init.signed_bytes(),
        Err(WireError::BadTime { .. })
    ));

    let mut issued = PairCsrIssued::from_wire(s(&t["messages"][5], "wire_text")).unwrap();
    issued.not_after = "2027-01-02T03:04:05".into();
    assert!(matches!(
        issued.verify_with(&gw.public_key_b64()),
        Err(WireError::BadTime {
            field: "not_after",
            ..
        })
    ));
}
