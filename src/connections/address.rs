//! Connections counted per address block (an IPv6 address's /64, an IPv4 address), for the
//! listeners that bound what one caller may hold open: the ops endpoint and the pairing
//! endpoint.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use carapace_filters::call::AddressBlock;

/// The connections each address block holds, at most `max` each.
#[derive(Debug)]
pub struct AddressPlaces {
    max: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place, given back when dropped.
#[derive(Debug)]
pub struct AddressPlace {
    places: Arc<AddressPlaces>,
    block: IpAddr,
}

impl AddressPlaces {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(AddressPlaces {
            max,
            held: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a connection from `ip`, if its block has one left.
    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Option<AddressPlace> {
        let block = AddressBlock(ip).key();
        let mut held = self.lock();
        let n = held.entry(block).or_default();
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(AddressPlace {
            places: self.clone(),
            block,
        })
    }
}

impl Drop for AddressPlace {
    fn drop(&mut self) {
        let mut held = self.places.lock();
        if let Some(n) = held.get_mut(&self.block) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.block);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_holds_at_most_its_places_and_gets_them_back() {
        let places = AddressPlaces::new(2);
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let same_block: IpAddr = "2001:db8::ffff:2".parse().unwrap();
        let other: IpAddr = "2001:db8:0:1::1".parse().unwrap();
        let first = places.take(a).unwrap();
        let _second = places.take(same_block).unwrap();
        assert!(places.take(a).is_none());
        assert!(places.take(other).is_some());
        drop(first);
        assert!(places.take(same_block).is_some());
        // IPv4, also as it comes on a dual-stack listener: by address.
        let v4: IpAddr = "192.0.2.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        let _v4 = (places.take(v4).unwrap(), places.take(mapped).unwrap());
        assert!(places.take(v4).is_none());
        assert!(places.take("192.0.2.2".parse().unwrap()).is_some());
    }
}
