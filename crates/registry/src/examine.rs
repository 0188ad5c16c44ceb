//! Which new bdevs the modules examine (SPDK's `bdev_auto_examine` and `bdev_examine`).
//!
//! By default every module looks at every new bdev for its own metadata: an lvstore loads its
//! volumes, a raid finds its superblock and assembles. A daemon that only serves disks to
//! others (a raid1 replica host) must not do that: its disk carries the raid's superblock, and
//! its own raid module would claim it for a raid it can never assemble. With auto-examine off,
//! only the bdevs named by `bdev_examine` (before or after they exist) are examined.

use std::collections::BTreeSet;

/// The examine policy; kept in the registry behind its own mutex (control plane only).
#[derive(Debug)]
pub(crate) struct ExamineGate {
    auto: bool,
    /// Names (or aliases) `bdev_examine` allowed while auto-examine is off.
    allowed: BTreeSet<String>,
}

impl Default for ExamineGate {
    fn default() -> Self {
        ExamineGate { auto: true, allowed: BTreeSet::new() }
    }
}

impl ExamineGate {
    pub(crate) fn set_auto(&mut self, auto: bool) {
        self.auto = auto;
    }

    pub(crate) fn auto(&self) -> bool {
        self.auto
    }

    /// Lets `name` be examined when it appears (or now, by the caller, if it exists).
    pub(crate) fn allow(&mut self, name: &str) {
        self.allowed.insert(name.to_string());
    }

    /// Whether a new bdev called `name` (with `aliases`) is examined.
    pub(crate) fn examines<'a>(&self, name: &'a str, mut aliases: impl Iterator<Item = &'a String>) -> bool {
        self.auto || self.allowed.contains(name) || aliases.any(|a| self.allowed.contains(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_examines_only_what_was_allowed() {
        let mut g = ExamineGate::default();
        assert!(g.examines("a", [].iter()));
        g.set_auto(false);
        assert!(!g.examines("a", [].iter()));
        g.allow("lvs/v");
        assert!(!g.examines("a", [].iter()));
        assert!(g.examines("lvs/v", [].iter()));
        assert!(g.examines("uuid-1", [String::from("lvs/v")].iter()));
    }
}
