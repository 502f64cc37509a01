//! The global allocator: mimalloc, asked for plain blocks when the layout allows it.
//!
//! The `mimalloc` crate's allocator passes every layout to `mi_malloc_aligned`, whose fast path
//! checks the alignment of the free block it found and whose slow path (blocks over 1 KiB)
//! searches for an aligned one. Almost every Rust allocation asks for an alignment that any
//! block of mimalloc's already has (up to 16 bytes, and no more than the size, the rule the
//! standard library's system allocator uses too), so those go to `mi_malloc`, `mi_zalloc` and
//! `mi_realloc`; the rest keep the aligned calls. Every block is freed by `mi_free`.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every mimalloc block of at least that size has (`MI_MAX_ALIGN_SIZE` on the
/// 64-bit targets carapace is built for).
const PLAIN_ALIGN: usize = 16;

/// mimalloc as the global allocator.
pub struct MiMalloc;

/// Whether a block from the plain calls satisfies `align` for `size` bytes.
#[inline]
fn plain(align: usize, size: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

// SAFETY: every block comes from mimalloc with at least the layout's size and alignment
// (`plain` holds exactly when mimalloc's ordinary blocks are aligned enough), and every block
// is given back to mimalloc.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain(layout.align(), layout.size()) {
            mi::mi_malloc(layout.size()).cast()
        } else {
            mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain(layout.align(), layout.size()) {
            mi::mi_zalloc(layout.size()).cast()
        } else {
            mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi::mi_free(ptr.cast::<c_void>());
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if plain(layout.align(), new_size) {
            mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
        } else {
            mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size and alignment class comes back aligned, keeps its bytes through a realloc
    /// (smaller and larger, across the plain/aligned boundary), and is zeroed when asked.
    #[test]
    fn blocks_are_aligned_and_keep_their_bytes() {
        let a = MiMalloc;
        for align in [1, 2, 8, 16, 32, 64, 4096] {
            for size in [1, 7, 8, 15, 16, 24, 100, 1024, 1500, 70_000] {
                let layout = Layout::from_size_align(size, align).unwrap();
                for new_size in [size / 2 + 1, size * 3] {
                    unsafe {
                        let p = a.alloc_zeroed(layout);
                        assert!(!p.is_null());
                        assert_eq!(p as usize % align, 0, "size {size} align {align}");
                        assert!((0..size).all(|i| *p.add(i) == 0));
                        for i in 0..size {
                            *p.add(i) = i as u8;
                        }
                        let q = a.realloc(p, layout, new_size);
                        assert!(!q.is_null());
                        assert_eq!(q as usize % align, 0, "to {new_size} align {align}");
                        assert!((0..size.min(new_size)).all(|i| *q.add(i) == i as u8));
                        a.dealloc(q, Layout::from_size_align(new_size, align).unwrap());
                        let r = a.alloc(layout);
                        assert_eq!(r as usize % align, 0, "size {size} align {align}");
                        a.dealloc(r, layout);
                    }
                }
            }
        }
    }
}
