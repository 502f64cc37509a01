use super::*;
use serde_json::json;

#[test]
fn first_escape_finds_the_first_escaped_byte_wherever_it_is() {
    let naive = |s: &[u8]| s.iter().position(|&b| is_escaped(b));
    // Every byte value at every place of strings up to 40 bytes long, on a background with
    // nothing to escape: ASCII, and bytes of multi-byte characters (high bit set).
    for background in [b'a', 0xA9, 0x7F, 0xFF, 0x20] {
        for len in 0..40 {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut s = vec![background; len];
                    s[at] = b;
                    assert_eq!(first_escape(&s), naive(&s), "{s:?}");
                    // A second one after it does not move the first.
                    if at + 1 < len {
                        s[len - 1] = b'"';
                        assert_eq!(first_escape(&s), naive(&s), "{s:?}");
                    }
                }
            }
        }
    }
}

fn canon(text: &str) -> String {
    canonical_string(&serde_json::from_str(text).expect("test json")).expect("canonical")
}

#[test]
fn objects_out_of_order_inside_objects_in_order_are_sorted_in_both_forms() {
    // The outer object iterates in order; "a" does not in either form ("10" before "9"
    // by code points), nor its member "9" (U+FF21 before U+1F600 by code points), nor the
    // array's object in the Skill Gateway form.
    let text = "{\"a\":{\"10\":1,\"9\":{\"\u{ff21}\":1,\"\u{1f600}\":2}},\"b\":[{\"2\":0,\"10\":0}],\"c\":{}}";
    assert_eq!(
        canon(text),
        "{\"a\":{\"9\":{\"\u{1f600}\":2,\"\u{ff21}\":1},\"10\":1},\"b\":[{\"2\":0,\"10\":0}],\"c\":{}}"
    );
    let value = serde_json::from_str(text).expect("test json");
    assert_eq!(
        jcs_string(&value).expect("jcs"),
        "{\"a\":{\"10\":1,\"9\":{\"\u{1f600}\":2,\"\u{ff21}\":1}},\"b\":[{\"10\":0,\"2\":0}],\"c\":{}}"
    );
}

#[test]
fn array_index_keys_are_hoisted_in_numeric_order() {
    assert_eq!(
        canon(r#"{"b":1,"10":1,"9":1,"a":1}"#),
        r#"{"9":1,"10":1,"a":1,"b":1}"#
    );
    // 2^32 - 2 is the largest array index; 2^32 - 1 is an ordinary key.
    assert_eq!(
        canon(r#"{"4294967294":1,"5":1}"#),
        r#"{"5":1,"4294967294":1}"#
    );
    assert_eq!(
        canon(r#"{"4294967295":1,"5":1}"#),
        r#"{"5":1,"4294967295":1}"#
    );
    assert_eq!(
        canon(r#"{"4294967295":1,"42949672950":1,"4":1}"#),
        r#"{"4":1,"4294967295":1,"42949672950":1}"#
    );
    // Leading zeros, signs, empty and non-digit keys are not indices.
    assert_eq!(
        canon(r#"{"01":1,"1":2,"-1":3,"0":4,"":5,"1a":6,"+1":7,"1.0":8}"#),
        r#"{"0":4,"1":2,"":5,"+1":7,"-1":3,"01":1,"1.0":8,"1a":6}"#
    );
    assert_eq!(array_index("0"), Some(0));
    assert_eq!(array_index("00"), None);
    assert_eq!(array_index("4294967294"), Some(4_294_967_294));
    assert_eq!(array_index("4294967295"), None);
    assert_eq!(array_index("99999999999"), None);
    assert_eq!(array_index("１"), None);
}

#[test]
fn keys_are_ordered_by_utf16_code_units() {
    // U+1F600 is D83D DE00 in UTF-16, so it sorts before U+E000 and U+FF21.
    assert_eq!(
        canon("{\"\u{ff21}\":1,\"\u{1f600}\":2,\"\u{e000}\":3,\"\u{ffff}\":4,\"\u{d7ff}\":5}"),
        "{\"\u{d7ff}\":5,\"\u{1f600}\":2,\"\u{e000}\":3,\"\u{ff21}\":1,\"\u{ffff}\":4}"
    );
    // Exhaustive cross-check of the byte-level comparator against encode_utf16.
    let samples = [
        "",
        "a",
        "A",
        "ab",
        "a\u{0}",
        "\u{7f}",
        "\u{80}",
        "é",
        "e\u{301}",
        "\u{7ff}",
        "\u{800}",
        "\u{d7ff}",
        "\u{e000}",
        "\u{e000}a",
        "\u{efff}",
        "\u{f000}",
        "\u{ff21}",
        "\u{ffff}",
        "\u{10000}",
        "\u{1f600}",
        "\u{1f600}a",
        "\u{1f601}",
        "\u{10ffff}",
        "a\u{1f600}",
        "a\u{ffff}",
        "a\u{e000}b",
        "a\u{10000}b",
        "\u{e000}\u{1f600}",
        "\u{1f600}\u{e000}",
    ];
    for a in samples {
        for b in samples {
            assert_eq!(
                cmp_utf16(a, b),
                a.encode_utf16().cmp(b.encode_utf16()),
                "{a:?} vs {b:?}"
            );
        }
    }
}

#[test]
fn numbers_use_ecmascript_number_to_string() {
    let cases: &[(&str, &str)] = &[
        ("1.0", "1"),
        ("-0", "0"),
        ("-0.0", "0"),
        ("0", "0"),
        ("-1", "-1"),
        ("1.5e3", "1500"),
        ("100e-2", "1"),
        ("0.1", "0.1"),
        ("1e21", "1e+21"),
        ("1e20", "100000000000000000000"),
        ("1e-6", "0.000001"),
        ("1e-7", "1e-7"),
        ("-1.25E-10", "-1.25e-10"),
        ("5e-324", "5e-324"),
        ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ("0.30000000000000004", "0.30000000000000004"),
        ("9007199254740991", "9007199254740991"),
        ("9007199254740992", "9007199254740992"),
        ("-9007199254740992", "-9007199254740992"),
        // Beyond u64/i64 serde_json already holds a double: forwarded as that double.
        ("-98765432109876543210", "-98765432109876540000"),
        ("123456789012345680000", "123456789012345680000"),
    ];
    for (input, expected) in cases {
        assert_eq!(canon(input), *expected, "{input}");
    }
}

/// Two bodies that differ only beyond 2^53 would share one signature while the app reads
/// different integers: neither can be signed.
#[test]
fn integers_beyond_2_pow_53_are_refused_not_rounded() {
    for input in [
        "9007199254740993",
        "9007199254740995",
        "-9007199254740993",
        "18446744073709551615",
        "-9223372036854775807",
        "12345678901234567890",
    ] {
        let v: Value = serde_json::from_str(&format!(r#"{{"a":[{input}]}}"#)).unwrap();
        assert_eq!(
            canonical_string(&v),
            Err(CanonicalError::InexactInteger {
                path: "/a/0".into()
            }),
            "{input}"
        );
    }
}

/// Beyond 2^53, an integer that is exactly what JS prints for its double is signed as
/// itself (it is what a JS signer sends).
#[test]
fn integers_printed_by_js_are_signed_as_themselves() {
    for input in [
        "9007199254740994",
        "12345678901234567000",
        "-9223372036854776000",
        "18446744073709552000",
    ] {
        assert_eq!(canon(input), input, "{input}");
    }
}

#[test]
fn strings_are_escaped_like_json_stringify() {
    let s = "q\" b\\ s/ \u{8}\u{c}\n\r\t \u{0}\u{1}\u{1b}\u{1f}\u{7f} \u{2028}\u{2029} é😀 <&>'";
    assert_eq!(
        canonical_string(&json!(s)).expect("canonical"),
        "\"q\\\" b\\\\ s/ \\b\\f\\n\\r\\t \\u0000\\u0001\\u001b\\u001f\u{7f} \u{2028}\u{2029} é😀 <&>'\""
    );
    // Keys are escaped the same way.
    assert_eq!(
        canon(r#"{"a\\b":2,"a\"b":1,"a\nb":3}"#),
        r#"{"a\nb":3,"a\"b":1,"a\\b":2}"#
    );
}

#[test]
fn structure_and_literals() {
    assert_eq!(
        canon(r#"{"z":{"b":[3,{"d":null,"c":true}],"a":false},"a":[],"m":{}}"#),
        r#"{"a":[],"m":{},"z":{"a":false,"b":[3,{"c":true,"d":null}]}}"#
    );
    assert_eq!(canon(" [ 1 , \"x\" ] "), r#"[1,"x"]"#);
}

#[test]
fn proto_member_is_refused_at_any_depth() {
    let uncovered = |path: &str| {
        Err(CanonicalError::UncoveredMember {
            path: path.to_owned(),
        })
    };
    let c = |text: &str| canonical_string(&serde_json::from_str(text).expect("json"));
    assert_eq!(c(r#"{"__proto__":1}"#), uncovered(""));
    assert_eq!(c(r#"[0,{"__proto__":{}}]"#), uncovered("/1"));
    assert_eq!(
        c(r#"{"a/b":{"~x":[{"__proto__":null}]}}"#),
        uncovered("/a~1b/~0x/0")
    );
    // Only the exact member name; values and look-alikes are covered.
    assert!(c(r#"{"__proto__x":1,"x":"__proto__","constructor":{},"__PROTO__":2}"#).is_ok());
    // Nothing partial is left in the output buffer.
    let mut out = String::from("prefix");
    let value = json!({"a": 1, "b": {"__proto__": 1}});
    assert!(write_canonical(&value, &mut out).is_err());
    assert_eq!(out, "prefix");
    let mut out = String::from("prefix");
    write_canonical(&json!({"b":1,"a":2}), &mut out).expect("canonical");
    assert_eq!(out, r#"prefix{"a":2,"b":1}"#);
}

#[test]
fn writer_caps_depth() {
    let mut value = json!(1);
    for _ in 0..MAX_DEPTH {
        value = Value::Array(vec![value]);
    }
    assert!(canonical_string(&value).is_ok());
    value = json!({ "k": value });
    assert_eq!(
        canonical_string(&value),
        Err(CanonicalError::TooDeep(MAX_DEPTH))
    );
}

/// RFC 8785 §3.2.3 and Appendix B, and where it parts from the Skill Gateway form.
#[test]
fn jcs_orders_by_utf16_code_units_only() {
    let v: Value = serde_json::from_str(
        r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#,
    )
    .unwrap();
    assert_eq!(
        jcs_string(&v).unwrap(),
        "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
    );
    let numbers: Value = serde_json::from_str(
        r#"{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"literals":[null,true,false]}"#,
    )
    .unwrap();
    assert_eq!(
        jcs_string(&numbers).unwrap(),
        r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27]}"#
    );
    let indexed = serde_json::json!({"10": 1, "9": 2, "__proto__": 3});
    assert_eq!(
        jcs_string(&indexed).unwrap(),
        r#"{"10":1,"9":2,"__proto__":3}"#
    );
    assert!(
        canonical_string(&indexed).is_err(),
        "the Skill Gateway form refuses __proto__"
    );
}
