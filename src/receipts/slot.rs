//! Where a call's receipt is left for the front that answers the caller.

use std::sync::{Arc, OnceLock};

use http::HeaderValue;

/// A call's receipt and, on the outbound side, how its check went.
#[derive(Debug, Clone)]
pub struct ReceiptNote {
    /// The receipt, when there is one (signed here, or a peer's that verified).
    pub receipt: Option<super::Receipt>,
    /// The `Carapace-Receipt` value; `None` when the peer sent none.
    pub encoded: Option<HeaderValue>,
    /// The outbound side's check (`verified`, `missing`, `invalid`); `None` on the side that
    /// signed.
    pub status: Option<&'static str>,
}

/// Put in a call's extensions by the front before the call stage runs; the receipt layer (or
/// the outbound back) fills it, and the front copies it into the response headers.
#[derive(Debug, Clone, Default)]
pub struct ReceiptSlot(Arc<OnceLock<ReceiptNote>>);

impl ReceiptSlot {
    /// Leave `note`; the first one stays.
    pub fn fill(&self, note: ReceiptNote) {
        let _ = self.0.set(note);
    }

    pub fn get(&self) -> Option<&ReceiptNote> {
        self.0.get()
    }

    /// Copy the note into `headers`.
    pub fn write_headers(&self, headers: &mut http::HeaderMap) {
        let Some(note) = self.get() else { return };
        if let Some(v) = &note.encoded {
            headers.insert(super::RECEIPT_HEADER, v.clone());
        }
        if let Some(s) = note.status {
            headers.insert(super::RECEIPT_STATUS_HEADER, HeaderValue::from_static(s));
        }
    }
}
