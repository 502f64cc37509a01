//! The nonce store's table: open addressing over buckets of one cache line each.
//!
//! A key (the nonce's 64-bit keyed hash) goes to the bucket its low bits name; when that
//! bucket's [`SLOTS`] slots are taken it goes to the next one, and so on (linear probing by
//! bucket). A bucket is 64 bytes aligned to 64: the five expiries, then the five hashes. So a
//! lookup or an insert touches one cache line, and one page, where a table of control bytes
//! beside the entries touches two of each. For a store bigger than the CPU's caches, each is
//! a miss on every call: the store's cost is its misses.
//!
//! An expired entry keeps its slot until the store drops the expired entries
//! ([`Table::retain_after`], which moves later entries back into the gaps), the table grows,
//! or a nonce on its way takes it over ([`Table::find_reusing`]). So the slots of a bucket are
//! filled in order, a free slot ends its bucket, and a bucket with a free slot ends a lookup.
//! A table holds at most [`FILL`] entries per bucket (80% of its slots), so a lookup always
//! ends.
//!
//! The buckets are an anonymous mapping, zeroed by the kernel (an expiry of 0 is a free
//! slot) and resident only as they are touched. Past 2 MiB it is advised to be backed by
//! huge pages, so that a table of millions of entries takes a few TLB entries, not
//! thousands.

use std::alloc::{handle_alloc_error, Layout};

use memmap2::{Advice, MmapMut};

/// Slots per bucket.
pub(super) const SLOTS: usize = 5;
/// Entries a table holds per bucket before it must be rebuilt: 4 of 5 slots.
pub(super) const FILL: usize = 4;
/// Bytes of a bucket: one cache line.
pub(super) const BUCKET_BYTES: usize = 64;
/// Tables from this size up are advised to be backed by huge pages.
const HUGE_PAGE: usize = 2 * 1024 * 1024;

/// One cache line of the table.
#[repr(C, align(64))]
struct Bucket {
    /// Unix seconds; 0 is a free slot (an entry's expiry is never 0).
    expiry: [u32; SLOTS],
    _unused: u32,
    key: [u64; SLOTS],
}

const _: () = assert!(std::mem::size_of::<Bucket>() == BUCKET_BYTES);
const _: () = assert!(std::mem::align_of::<Bucket>() == BUCKET_BYTES);

/// Where a key is, or would go: its bucket and slot, and the key's expiry there (0: the key
/// is not in the table).
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    bucket: usize,
    slot: usize,
    pub(super) expiry: u32,
    /// The slot is free: putting the key there takes one more slot of the table. Otherwise
    /// it holds the key, or an expired entry the key may take over.
    pub(super) free: bool,
}

/// The table: a power-of-two number of buckets.
pub(super) struct Table {
    map: MmapMut,
    /// Buckets minus one.
    mask: usize,
    /// Slots taken (live or expired entries).
    len: usize,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("buckets", &self.buckets())
            .field("len", &self.len)
            .finish()
    }
}

/// Buckets of the smallest table that holds `entries`.
fn buckets_for(entries: usize) -> usize {
    entries.div_ceil(FILL).max(1).next_power_of_two()
}

/// Bytes of the smallest table that holds `entries`.
pub(super) fn bytes_for(entries: usize) -> usize {
    buckets_for(entries) * BUCKET_BYTES
}

impl Table {
    /// An empty table that holds at least `entries`. Memory that cannot be mapped ends the
    /// process, as any allocation that fails does.
    pub(super) fn with_capacity(entries: usize) -> Table {
        let buckets = buckets_for(entries);
        let len = buckets * BUCKET_BYTES;
        let Ok(map) = MmapMut::map_anon(len) else {
            handle_alloc_error(Layout::from_size_align(len, BUCKET_BYTES).expect("a bucket array"))
        };
        if len >= HUGE_PAGE {
            // Advice only: a kernel without transparent huge pages keeps small ones.
            let _ = map.advise(Advice::HugePage);
        }
        Table {
            map,
            mask: buckets - 1,
            len: 0,
        }
    }

    fn buckets(&self) -> usize {
        self.mask + 1
    }

    fn bucket_slice(&self) -> &[Bucket] {
        // SAFETY: the mapping is page-aligned (so 64-byte aligned), exactly `buckets` buckets
        // long, and every bit pattern is a valid `Bucket` (integers only); it lives as long
        // as `self`, and `&self` excludes the `&mut` of `bucket_slice_mut`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<Bucket>(), self.buckets()) }
    }

    fn bucket_slice_mut(&mut self) -> &mut [Bucket] {
        // SAFETY: as in `bucket_slice`, with `&mut self` for exclusive access.
        unsafe {
            std::slice::from_raw_parts_mut(self.map.as_mut_ptr().cast::<Bucket>(), self.buckets())
        }
    }

    /// Entries the table holds before it must be rebuilt.
    pub(super) fn capacity(&self) -> usize {
        self.buckets() * FILL
    }

    /// Slots taken, by live or expired entries.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Bytes of the table's mapping.
    pub(super) fn bytes(&self) -> usize {
        self.buckets() * BUCKET_BYTES
    }

    /// Where the table starts and its bucket mask, for [`prefetch`].
    pub(super) fn layout(&self) -> (usize, usize) {
        (self.map.as_ptr() as usize, self.mask)
    }

    /// Where `key` is, or the free slot it would take.
    pub(super) fn find(&self, key: u64) -> Slot {
        self.find_reusing(key, 0)
    }

    /// Where `key` is; when it is not there, the first slot on its way holding an entry
    /// that expires at `cut` or before (an expired one, which the key may take over without
    /// taking one more slot), else the free slot it would take. A lookup still finds the
    /// key there: it comes before the free slot that ends the way.
    pub(super) fn find_reusing(&self, key: u64, cut: u32) -> Slot {
        let buckets = self.bucket_slice();
        let mut reusable = None;
        let mut at = key as usize & self.mask;
        loop {
            let b = &buckets[at];
            for slot in 0..SLOTS {
                let expiry = b.expiry[slot];
                if expiry == 0 {
                    let (bucket, slot) = reusable.unwrap_or((at, slot));
                    return Slot {
                        bucket,
                        slot,
                        expiry: 0,
                        free: reusable.is_none(),
                    };
                }
                if b.key[slot] == key {
                    return Slot {
                        bucket: at,
                        slot,
                        expiry,
                        free: false,
                    };
                }
                if reusable.is_none() && expiry <= cut {
                    reusable = Some((at, slot));
                }
            }
            at = (at + 1) & self.mask;
        }
    }

    /// Stores `key` with `expiry` (not 0) at `at`, which [`find`](Self::find) or
    /// [`find_reusing`](Self::find_reusing) gave for `key` with no change to the table since.
    /// The caller keeps `len` below [`capacity`](Self::capacity) when the slot is free.
    pub(super) fn put(&mut self, at: Slot, key: u64, expiry: u32) {
        debug_assert!(expiry != 0);
        if at.free {
            self.len += 1;
        }
        let b = &mut self.bucket_slice_mut()[at.bucket];
        b.key[at.slot] = key;
        b.expiry[at.slot] = expiry;
    }

    /// Stores `key` with `expiry`, keeping the later expiry if it is there already (a
    /// journal may hold a nonce twice). The table grows as needed: a journal may hold more
    /// live entries than the store's capacity.
    pub(super) fn insert_max(&mut self, key: u64, expiry: u32) {
        if self.len >= self.capacity() {
            *self = self.grown(self.len + 1, 0).0;
        }
        let at = self.find(key);
        if at.expiry < expiry {
            self.put(at, key, expiry);
        }
    }

    /// Every entry, live or expired: `(key, expiry)`.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.bucket_slice().iter().flat_map(|b| {
            (0..SLOTS)
                .take_while(|&s| b.expiry[s] != 0)
                .map(|s| (b.key[s], b.expiry[s]))
        })
    }

    /// A bigger table (room for `entries`, at least this one's live entries) holding only
    /// the entries that expire after `cut`. Returns it with the smallest expiry it holds
    /// (`u32::MAX` when empty).
    pub(super) fn grown(&self, entries: usize, cut: u32) -> (Table, u32) {
        let mut fresh = Table::with_capacity(entries);
        let mut earliest = u32::MAX;
        for (key, expiry) in self.iter().filter(|&(_, e)| e > cut) {
            let at = fresh.find(key);
            fresh.put(at, key, expiry);
            earliest = earliest.min(expiry);
        }
        (fresh, earliest)
    }

    /// Removes, in place, the entries whose expiry is `cut` or before. Returns how many
    /// went and the smallest expiry left (`u32::MAX` when none is).
    ///
    /// Slots are taken in probe order: bucket by bucket, each bucket's slots in order, an
    /// entry in the first free slot from its bucket's first. Each removal moves later
    /// entries of its run back into the gap (Knuth's algorithm R for linear probing), so
    /// that every entry stays where a lookup from its bucket finds it, and the slots of
    /// every bucket stay filled in order.
    pub(super) fn retain_after(&mut self, cut: u32) -> (usize, u32) {
        // Start after a bucket with a free slot (there is one: at most 4 of 5 slots are
        // taken), so that every run of taken slots is seen whole, in order.
        let first = self
            .bucket_slice()
            .iter()
            .position(|b| b.expiry[SLOTS - 1] == 0)
            .expect("a table is never full");
        // The smallest expiry kept, less one: a free slot's 0 becomes `u32::MAX` and counts
        // for nothing, and `e - 1 < cut` is `0 < e <= cut`, an entry that goes.
        let (mut removed, mut lowest) = (0, u32::MAX);
        for i in 1..=self.buckets() {
            let at = (first + i) & self.mask;
            let less = self.bucket_slice()[at].expiry.map(|e| e.wrapping_sub(1));
            // Most buckets lose nothing: one look at their five expiries, without a branch.
            if !less.iter().fold(false, |goes, &l| goes | (l < cut)) {
                lowest = less.iter().fold(lowest, |m, &l| m.min(l));
                continue;
            }
            let mut slot = 0;
            while slot < SLOTS {
                let expiry = self.bucket_slice()[at].expiry[slot];
                if expiry == 0 {
                    break;
                }
                if expiry > cut {
                    lowest = lowest.min(expiry - 1);
                    slot += 1;
                } else {
                    // The slot now holds an entry moved back from later in its run, or is
                    // free: look at it again.
                    self.remove_at(at * SLOTS + slot);
                    removed += 1;
                }
            }
        }
        let earliest = if lowest == u32::MAX {
            u32::MAX
        } else {
            lowest + 1
        };
        (removed, earliest)
    }

    /// The key and expiry in slot `t` (of all slots in probe order).
    fn slot(&self, t: usize) -> (u64, u32) {
        let b = &self.bucket_slice()[t / SLOTS];
        (b.key[t % SLOTS], b.expiry[t % SLOTS])
    }

    fn set_slot(&mut self, t: usize, key: u64, expiry: u32) {
        let b = &mut self.bucket_slice_mut()[t / SLOTS];
        b.key[t % SLOTS] = key;
        b.expiry[t % SLOTS] = expiry;
    }

    /// Frees slot `gap`, moving back each later entry of its run that a lookup would still
    /// find there (its bucket's first slot is not in the stretch after the gap).
    fn remove_at(&mut self, mut gap: usize) {
        let total = self.buckets() * SLOTS;
        let mut at = gap;
        loop {
            at = (at + 1) % total;
            let (key, expiry) = self.slot(at);
            if expiry == 0 {
                break;
            }
            let home = (key as usize & self.mask) * SLOTS;
            let home_after_gap = if gap <= at {
                gap < home && home <= at
            } else {
                gap < home || home <= at
            };
            if !home_after_gap {
                self.set_slot(gap, key, expiry);
                gap = at;
            }
        }
        self.set_slot(gap, 0, 0);
        self.len -= 1;
    }
}

/// Starts loading the bucket of `key` in the table at `layout` into the cache. Any address
/// will do: a prefetch never faults, so a table replaced since `layout` was read costs a
/// useless load at most.
#[inline]
pub(super) fn prefetch((base, mask): (usize, usize), key: u64) {
    let addr = base.wrapping_add((key as usize & mask).wrapping_mul(BUCKET_BYTES));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and never faults, whatever the
    // address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(t: &mut Table, key: u64, expiry: u32) {
        let at = t.find(key);
        t.put(at, key, expiry);
    }

    #[test]
    fn sizes_are_a_power_of_two_buckets_at_four_entries_each() {
        for (entries, buckets) in [(0, 1), (1, 1), (4, 1), (5, 2), (9, 4), (4096, 1024)] {
            let t = Table::with_capacity(entries);
            assert_eq!(t.bytes(), buckets * 64, "{entries}");
            assert_eq!(t.capacity(), buckets * 4, "{entries}");
            assert_eq!(bytes_for(entries), buckets * 64, "{entries}");
        }
    }

    /// Keys that all start in the same bucket spill into the next ones, and each is found
    /// where it was put, across the end of the table too.
    #[test]
    fn colliding_keys_probe_into_the_next_buckets_and_wrap() {
        let mut t = Table::with_capacity(16);
        assert_eq!(t.buckets(), 4);
        // Bucket 3 (the last): its 5 slots, then buckets 0 and 1.
        let keys: Vec<u64> = (0..12).map(|i| 3 + 4 * i).collect();
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(t.find(k).expiry, 0);
            put(&mut t, k, 100 + i as u32);
        }
        assert_eq!(t.len(), 12);
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(t.find(k).expiry, 100 + i as u32, "{k}");
        }
        assert_eq!(t.find(keys[0]).bucket, 3);
        assert_eq!(t.find(keys[5]).bucket, 0);
        assert_eq!(t.find(keys[11]).bucket, 1);
        // A key of bucket 0 goes after the spilled ones.
        assert_eq!(t.find(4 * 100).expiry, 0);
        assert_eq!(t.find(4 * 100).bucket, 1);
        let mut all: Vec<_> = t.iter().collect();
        all.sort();
        assert_eq!(all.len(), 12);
    }

    #[test]
    fn an_absent_key_takes_over_the_first_expired_entry_on_its_way() {
        let mut t = Table::with_capacity(16);
        // Bucket 1: 5 (expiry 50), 9 (10), 13 (60), 17 (5); a key of bucket 1 looks at all.
        for (k, e) in [(5, 50), (9, 10), (13, 60), (17, 5)] {
            put(&mut t, k, e);
        }
        // Present, expired or not: its own slot.
        let own = t.find_reusing(9, 20);
        assert_eq!((own.expiry, own.free), (10, false));
        assert_eq!(t.find_reusing(13, 20).expiry, 60);
        // Absent: the slot of 9, the first expired one, not the free slot after 17.
        let at = t.find_reusing(21, 20);
        assert_eq!((at.expiry, at.free), (0, false));
        t.put(at, 21, 70);
        assert_eq!(t.len(), 4);
        assert_eq!(t.find(21).expiry, 70);
        assert_eq!(t.find(9).expiry, 0);
        assert_eq!(t.find(17).expiry, 5);
        // Nothing expired on the way: the free slot.
        let at = t.find_reusing(25, 0);
        assert!(at.free);
        t.put(at, 25, 80);
        assert_eq!(t.len(), 5);
        let mut all: Vec<_> = t.iter().collect();
        all.sort();
        assert_eq!(all, [(5, 50), (13, 60), (17, 5), (21, 70), (25, 80)]);
    }

    #[test]
    fn a_key_found_again_takes_its_own_slot() {
        let mut t = Table::with_capacity(4);
        put(&mut t, 7, 10);
        put(&mut t, 7, 20);
        assert_eq!(t.len(), 1);
        assert_eq!(t.find(7).expiry, 20);
        // The later expiry wins when loading.
        t.insert_max(7, 15);
        assert_eq!(t.find(7).expiry, 20);
        t.insert_max(7, 30);
        assert_eq!(t.find(7).expiry, 30);
    }

    #[test]
    fn loading_past_capacity_grows_and_keeps_every_entry() {
        let mut t = Table::with_capacity(4);
        for k in 0..1000u64 {
            t.insert_max(k.wrapping_mul(0x9E37_79B9_7F4A_7C15), 5);
        }
        assert_eq!(t.len(), 1000);
        assert!(t.capacity() >= 1000);
        for k in 0..1000u64 {
            assert_eq!(t.find(k.wrapping_mul(0x9E37_79B9_7F4A_7C15)).expiry, 5);
        }
    }

    #[test]
    fn growing_keeps_only_what_is_live() {
        let mut t = Table::with_capacity(64);
        for k in 0..40u64 {
            put(
                &mut t,
                k * 7919,
                if k % 2 == 0 { 10 } else { 20 + k as u32 },
            );
        }
        let (fresh, earliest) = t.grown(128, 10);
        assert_eq!(fresh.len(), 20);
        assert_eq!(fresh.capacity(), 128);
        assert_eq!(earliest, 21);
        for k in 0..40u64 {
            let e = fresh.find(k * 7919).expiry;
            assert_eq!(e, if k % 2 == 0 { 0 } else { 20 + k as u32 });
        }
    }

    /// Removals in place, against a model, with keys crowded into few buckets so that runs
    /// are long and wrap around the end: every kept entry is still found, no removed one
    /// is, and each bucket's slots are filled in order.
    #[test]
    fn removals_in_place_keep_every_run_whole() {
        use std::collections::HashMap;
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..200 {
            let mut t = Table::with_capacity(64);
            let mut model = HashMap::new();
            let crowd = 1 + round % 4;
            while t.len() < t.capacity() {
                // Keys whose buckets are among the last `crowd` ones (bucket = low bits).
                let key = (next() & !15) | (15 - next() % crowd);
                let at = t.find(key);
                let expiry = 1 + (next() % 100) as u32;
                t.put(at, key, expiry);
                model.insert(key, expiry);
            }
            let cut = (next() % 100) as u32;
            let (removed, earliest) = t.retain_after(cut);
            model.retain(|_, e| *e > cut);
            assert_eq!(t.len(), model.len(), "round {round}");
            assert_eq!(removed, t.capacity() - model.len());
            assert_eq!(earliest, model.values().copied().min().unwrap_or(u32::MAX));
            for (&key, &expiry) in &model {
                assert_eq!(t.find(key).expiry, expiry, "round {round}");
            }
            let mut listed: Vec<_> = t.iter().collect();
            listed.sort();
            let mut want: Vec<_> = model.into_iter().collect();
            want.sort();
            assert_eq!(listed, want, "round {round}");
            // Refilled after the removals, the table still finds everything.
            while t.len() < t.capacity() {
                let key = next();
                let at = t.find(key);
                assert_eq!(at.expiry, 0);
                t.put(at, key, 7);
                assert_eq!(t.find(key).expiry, 7);
            }
        }
    }

    #[test]
    fn a_prefetch_of_any_address_is_harmless() {
        let t = Table::with_capacity(4096);
        prefetch(t.layout(), u64::MAX);
        prefetch((0, usize::MAX), 12345);
        prefetch((usize::MAX, usize::MAX), u64::MAX);
    }
}
