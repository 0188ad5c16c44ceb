//! The plain types every layer of a raid names: its level, and a member slot's state (which
//! the superblock records and the layout publishes).

/// SPDK's raid levels that flashpath has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaidLevel {
    /// Striping, `strip_size_kb` per base in turn.
    Raid0,
    /// Bases one after the other.
    Concat,
    /// Every base holds all the data.
    Raid1,
}

impl RaidLevel {
    /// SPDK's name (`raid_level` in RPCs and `bdev_raid_get_bdevs`).
    pub fn name(self) -> &'static str {
        match self {
            RaidLevel::Raid0 => "raid0",
            RaidLevel::Concat => "concat",
            RaidLevel::Raid1 => "raid1",
        }
    }

    /// Parses SPDK's names, including its aliases "0" and "1".
    pub fn parse(s: &str) -> Option<RaidLevel> {
        match s {
            "raid0" | "0" => Some(RaidLevel::Raid0),
            "concat" => Some(RaidLevel::Concat),
            "raid1" | "1" => Some(RaidLevel::Raid1),
            _ => None,
        }
    }
}

/// A slot's state, as the superblock records it and the layout publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// No base: removed, or never found (a degraded raid's missing replica).
    Empty,
    /// In sync: reads may come from it, writes go to it.
    Active,
    /// Taken out after an I/O error; kept claimed until `bdev_raid_remove_base_bdev`.
    Failed,
    /// Being rebuilt: writes go to it, reads never come from it.
    Rebuilding,
}

impl SlotState {
    /// Whether writes go to a base in this state.
    #[inline]
    pub fn takes_writes(self) -> bool {
        matches!(self, SlotState::Active | SlotState::Rebuilding)
    }
}
