//! (placeholder: replaced by its owner; see /work/wt/briefs26)
