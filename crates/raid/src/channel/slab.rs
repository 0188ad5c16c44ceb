//! A fixed-capacity slab: the parents a channel has in flight, indexed by the tag its children
//! carry down. Made once per channel; `insert` and `remove` only move an index on a free list.

/// Entries of type `T`, at most `capacity` of them in use.
pub struct Slab<T> {
    entries: Box<[T]>,
    free: Vec<u32>,
}

impl<T: Default> Slab<T> {
    /// A slab of `capacity` entries, all free.
    pub fn new(capacity: usize) -> Slab<T> {
        let entries = (0..capacity).map(|_| T::default()).collect();
        // Popped from the end: the lowest index first, which keeps a light load on few lines.
        let free = (0..capacity as u32).rev().collect();
        Slab { entries, free }
    }
}

impl<T> Slab<T> {
    /// Takes a free entry, set to `value`; `None` when every entry is in use.
    #[inline]
    pub fn insert(&mut self, value: T) -> Option<u32> {
        let i = self.free.pop()?;
        self.entries[i as usize] = value;
        Some(i)
    }

    /// Gives entry `i` back.
    #[inline]
    pub fn remove(&mut self, i: u32) {
        debug_assert!(!self.free.contains(&i), "slab entry {i} freed twice");
        self.free.push(i);
    }

    /// Entry `i`, to read.
    #[inline]
    pub fn get(&self, i: u32) -> &T {
        &self.entries[i as usize]
    }

    /// Entry `i`.
    #[inline]
    pub fn get_mut(&mut self, i: u32) -> &mut T {
        &mut self.entries[i as usize]
    }

    /// Entries in use.
    #[inline]
    pub fn used(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// Entries in all.
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Slab;

    #[test]
    fn fills_up_then_reuses_freed_entries() {
        let mut s: Slab<u64> = Slab::new(3);
        let a = s.insert(1).unwrap();
        let b = s.insert(2).unwrap();
        let c = s.insert(3).unwrap();
        assert_eq!((a, b, c), (0, 1, 2));
        assert_eq!(s.insert(4), None);
        assert_eq!(s.used(), 3);
        s.remove(b);
        assert_eq!(s.insert(5), Some(b));
        assert_eq!(*s.get_mut(b), 5);
        assert_eq!(s.capacity(), 3);
    }
}
