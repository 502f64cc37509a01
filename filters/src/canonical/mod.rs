//! Canonical JSON and HMAC-SHA256 for Skill Gateway v1 signatures (Vagus compatible).
//!
//! The reference implementation (Vagus-Bot, TypeScript) signs
//! `JSON.stringify(sortKeysDeep(fields))` with HMAC-SHA256. This module reproduces that string
//! byte for byte from a [`serde_json::Value`]:
//!
//! * **Object members** are ordered the way a JS engine enumerates an object whose keys were
//!   inserted in `Array.prototype.sort()` order: first every *array-index* key (a canonical
//!   decimal integer `0..=4294967294`: digits only, no sign, no leading zero except `"0"`
//!   itself) in ascending numeric order, then all other keys ordered by UTF-16 code units
//!   (not by UTF-8 bytes / code points: an astral character such as `😀` sorts *before*
//!   `U+E000..=U+FFFF`).
//! * **Arrays** keep their order.
//! * **Numbers** are coerced to `f64` and printed with ECMAScript `Number::toString`
//!   (`1.0` → `1`, `-0` → `0`, `1e21` → `1e+21`, `1e-7` → `1e-7`, `0.000001` stays fixed,
//!   integers above 2⁵³ are rounded to the nearest `f64`).
//! * **Strings** are escaped like `JSON.stringify`: `\"` `\\` `\b` `\f` `\n` `\r` `\t`, the other
//!   C0 controls as `\u00xx` (lowercase hex); everything else, including `/`, DEL, U+2028,
//!   U+2029 and all non-ASCII characters, is emitted as raw UTF-8.
//! * No insignificant whitespace.
//!
//! # Where this module deliberately fails closed
//!
//! * A member named `__proto__` is silently **dropped** by the JS implementation (the assignment
//!   hits the prototype setter), so the body would carry data the MAC does not cover. Such a
//!   member at any depth is refused with [`CanonicalError::UncoveredMember`].
//! * JS `JSON.parse` lets the last duplicate member win; [`parse_strict`] refuses duplicates
//!   ([`CanonicalError::DuplicateMember`]) so the value that is verified is never ambiguous.
//! * Lone surrogates (`"\ud800"`) and out-of-range numbers (`1e400`, which JS turns into
//!   `Infinity` and then `null`) cannot be represented in a `serde_json::Value`; the parser
//!   refuses them ([`CanonicalError::Syntax`]).
//!
//! Number parsing precision: the canonical number is the `f64` that serde_json parsed. JS
//! parses decimal literals with correct rounding; serde_json only does so with its
//! `float_roundtrip` feature (its default fast path can be one ULP off for long mantissas).
//! This crate enables that feature in its manifest; a unit test guards it.

mod hmac;
mod strict;
mod write;

use std::borrow::Cow;
use std::fmt;

pub use self::hmac::{
    decode_hex32, decode_signature_hex, hmac_sha256_hex, verify_hmac_sha256_hex, HmacSha256Key,
};
pub use strict::{parse_strict, StrictSeed};
pub use write::{
    canonical_string, first_escape, jcs_string, write_canonical, write_canonical_str, write_jcs,
};

/// Maximum number of nested arrays/objects accepted by [`parse_strict`] and [`write_canonical`].
///
/// [`write_canonical`] accepts exactly `MAX_DEPTH` nested containers. [`parse_strict`] is in
/// practice one level stricter: serde_json's built-in recursion limit (which cannot be turned
/// off without its `unbounded_depth` feature) already refuses the 128th nested container; that
/// refusal is reported as [`CanonicalError::TooDeep`] as well. The parser's own check is the
/// backstop should that limit ever be disabled.
pub const MAX_DEPTH: usize = 128;

/// Error for inputs whose canonical form would not cover everything they carry.
///
/// Paths are JSON Pointers (RFC 6901) to the *object* concerned: `""` is the root,
/// `/input/a` is member `a` of member `input`, array elements are addressed by index,
/// and `~` / `/` inside keys are written `~0` / `~1`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CanonicalError {
    /// The object at `path` has a member named `__proto__`, which the reference implementation
    /// drops from the signed string.
    #[error("member `__proto__` at {path} is not covered by the canonical form")]
    UncoveredMember {
        /// JSON Pointer of the object that holds the `__proto__` member.
        path: String,
    },
    /// The value at `path` is an integer beyond ±2^53 that is not what JS prints for its
    /// nearest double: the reference signs that double while the body carries the exact
    /// integer.
    #[error("integer at {path} is outside ±2^53 and cannot be signed exactly")]
    InexactInteger {
        /// JSON Pointer of the number.
        path: String,
    },
    /// The object at `path` has member `key` more than once.
    #[error("duplicate member `{key}` at {path}")]
    DuplicateMember {
        /// JSON Pointer of the object that holds the duplicate.
        path: String,
        /// The repeated member name.
        key: String,
    },
    /// The body is not JSON that can be represented faithfully (includes lone surrogates,
    /// numbers out of `f64` range and trailing data).
    #[error("body is not valid JSON: {0}")]
    Syntax(String),
    /// More than the given number of nested arrays/objects.
    #[error("nesting deeper than {0} levels")]
    TooDeep(usize),
}

// ---------------------------------------------------------------------------------------------
// Error paths (built lazily, only when an error unwinds)
// ---------------------------------------------------------------------------------------------

/// One step of a JSON Pointer.
enum Seg<'a> {
    Key(Cow<'a, str>),
    Index(usize),
}

/// Renders segments collected innermost-first (while unwinding) as a JSON Pointer.
fn render_path(innermost_first: &[Seg<'_>]) -> String {
    let mut path = String::new();
    for seg in innermost_first.iter().rev() {
        path.push('/');
        match seg {
            Seg::Key(k) => {
                for c in k.chars() {
                    match c {
                        '~' => path.push_str("~0"),
                        '/' => path.push_str("~1"),
                        c => path.push(c),
                    }
                }
            }
            Seg::Index(i) => {
                use fmt::Write as _;
                let _ = write!(path, "{i}");
            }
        }
    }
    path
}

#[cfg(test)]
mod tests;
