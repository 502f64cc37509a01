//! The Merkle tree a batch of receipts is signed as: RFC 9162 (Certificate Transparency 2.0)
//! §2.1 with SHA-256. A leaf's hash is `SHA-256(0x00 ‖ data)`, a node's `SHA-256(0x01 ‖ left ‖
//! right)`; a tree of `n` leaves splits at the largest power of two below `n`. A receipt's
//! inclusion proof is its index, the tree's size and its audit path (the siblings from the
//! leaf up), verified as RFC 9162 §2.1.3.2 says.

use sha2::{Digest as _, Sha256};

/// A node of the tree.
pub type Hash = [u8; 32];

/// The deepest path a tree of `u32::MAX` leaves has.
pub const MAX_DEPTH: usize = 32;

/// `SHA-256(0x00 ‖ data)`.
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(data);
    h.finalize().into()
}

fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The root over `leaves` (leaf hashes, at least one) and each leaf's audit path, bottom-up.
pub fn tree(leaves: &[Hash]) -> (Hash, Vec<Vec<Hash>>) {
    assert!(!leaves.is_empty(), "a tree has a leaf");
    // Every path is at most as long as the deepest one, the bits of `n - 1`.
    let depth = (usize::BITS - (leaves.len() - 1).leading_zeros()) as usize;
    let mut paths: Vec<Vec<Hash>> = (0..leaves.len())
        .map(|_| Vec::with_capacity(depth))
        .collect();
    let root = build(leaves, &mut paths);
    (root, paths)
}

/// The largest power of two below `n` (n > 1).
fn split(n: usize) -> usize {
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

fn build(leaves: &[Hash], paths: &mut [Vec<Hash>]) -> Hash {
    if leaves.len() == 1 {
        return leaves[0];
    }
    let k = split(leaves.len());
    let (left_paths, right_paths) = paths.split_at_mut(k);
    let left = build(&leaves[..k], left_paths);
    let right = build(&leaves[k..], right_paths);
    left_paths.iter_mut().for_each(|p| p.push(right));
    right_paths.iter_mut().for_each(|p| p.push(left));
    node_hash(&left, &right)
}

/// The root that `leaf` at `index` of a tree of `size` leaves proves with `path`; `None` when
/// the index is outside the tree or the path is not the length the position needs. Trees of
/// other sizes can share a root and a path, so what is signed must name the size too.
pub fn root_from_path(index: u64, size: u64, leaf: Hash, path: &[Hash]) -> Option<Hash> {
    if index >= size {
        return None;
    }
    let (mut fn_, mut sn) = (index, size - 1);
    let mut r = leaf;
    for p in path {
        if sn == 0 {
            return None;
        }
        if fn_ & 1 == 1 || fn_ == sn {
            r = node_hash(p, &r);
            while fn_ & 1 == 0 && fn_ != 0 {
                fn_ >>= 1;
                sn >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    (sn == 0).then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 9162's MTH as the text defines it, recursively over the data.
    fn mth(data: &[Vec<u8>]) -> Hash {
        match data.len() {
            0 => Sha256::digest([]).into(),
            1 => leaf_hash(&data[0]),
            n => {
                let mut k = 1;
                while k * 2 < n {
                    k *= 2;
                }
                node_hash(&mth(&data[..k]), &mth(&data[k..]))
            }
        }
    }

    fn data(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("receipt {i}").into_bytes())
            .collect()
    }

    #[test]
    fn the_root_is_rfc_9162s_and_every_leaf_proves_it() {
        for n in 1..=70 {
            let data = data(n);
            let leaves: Vec<Hash> = data.iter().map(|d| leaf_hash(d)).collect();
            let (root, paths) = tree(&leaves);
            assert_eq!(root, mth(&data), "size {n}");
            for (i, path) in paths.iter().enumerate() {
                assert!(path.len() <= MAX_DEPTH);
                let got = root_from_path(i as u64, n as u64, leaves[i], path);
                assert_eq!(got, Some(root), "leaf {i} of {n}");
            }
        }
    }

    #[test]
    fn a_wrong_index_path_or_leaf_proves_another_root_or_none() {
        let data = data(11);
        let leaves: Vec<Hash> = data.iter().map(|d| leaf_hash(d)).collect();
        let (root, paths) = tree(&leaves);
        let ok = |i: u64, size: u64, leaf: Hash, path: &[Hash]| {
            root_from_path(i, size, leaf, path) == Some(root)
        };
        for i in 0..11u64 {
            let path = &paths[i as usize];
            let leaf = leaves[i as usize];
            for other in (0..14u64).filter(|&o| o != i) {
                assert!(!ok(other, 11, leaf, path), "index {other} for leaf {i}");
            }
            // Another size can lead to the same root (leaf 0's siblings are the same in any
            // tree of 9 to 16 leaves): the signature covers the size beside the root.
            for size in (1..=i).chain(17..20) {
                assert!(!ok(i, size, leaf, path), "size {size} for leaf {i}");
            }
            assert!(!ok(i, 11, leaf_hash(b"other"), path));
            assert!(!ok(i, 11, leaf, &path[..path.len() - 1]));
            let mut longer = path.clone();
            longer.push(root);
            assert!(!ok(i, 11, leaf, &longer));
            for k in 0..path.len() {
                let mut changed = path.clone();
                changed[k][0] ^= 1;
                assert!(!ok(i, 11, leaf, &changed), "path[{k}] of leaf {i}");
            }
        }
        assert_eq!(root_from_path(11, 11, leaves[0], &paths[0]), None);
        assert_eq!(root_from_path(0, 0, leaves[0], &[]), None);
    }
}
