//! Making the store's changes durable: a commit writes the whole metadata to the area not
//! holding the last durable generation and flushes, in one call or planned and carried out by
//! the caller (docs/lvol-format.md, "Atomic updates").

use super::{CommitPlan, Store};
use crate::format::{self, SuperBlock, MAX_STREAM_PAGES};
use crate::{LvolError, MetaDevice};

impl Store {
    /// Commits every change so far: writes the metadata to the area not holding the last
    /// durable generation, then flushes. Returns the generation now durable.
    pub fn commit<D: MetaDevice>(&mut self, dev: &mut D) -> Result<u64, LvolError> {
        let plan = self.prepare_commit()?;
        let result =
            plan.writes().try_for_each(|(page, data)| dev.write_page(page, data)).and_then(|()| dev.flush());
        match result {
            Ok(()) => {
                let g = plan.generation;
                self.commit_done(plan);
                Ok(g)
            }
            Err(e) => {
                self.commit_failed(plan);
                Err(e.into())
            }
        }
    }

    /// The writes of the next commit; one commit at a time. Changes made after this call go to
    /// the next commit.
    pub fn prepare_commit(&mut self) -> Result<CommitPlan, LvolError> {
        if self.committing {
            return Err(LvolError::CommitInFlight);
        }
        if self.generation >= format::MAX_GENERATION {
            return Err(LvolError::Corrupt(format!(
                "generation {} is the last a store may reach: no commit after it",
                self.generation
            )));
        }
        let area = 1 - self.area;
        let stream = format::encode_stream(&self.volumes);
        let mut pages = format::stream_pages(&stream);
        debug_assert!(pages.len() <= MAX_STREAM_PAGES && (pages.len() as u32) < self.label.area_pages);
        let sb = SuperBlock {
            generation: self.generation + 1,
            uuid: self.label.uuid,
            cluster_size: self.label.cluster_size,
            block_size: self.label.block_size,
            area_pages: self.label.area_pages,
            total_clusters: self.total_clusters,
            free_clusters: self.free_clusters(),
            stream_len: stream.len() as u64,
            name: self.name.clone(),
            page_crcs: pages.iter().map(|p| crate::crc::crc32c(&p[..])).collect(),
        };
        pages.insert(0, sb.encode());
        let changed = (0..pages.len())
            .filter(|&i| self.known[area].as_ref().and_then(|k| k.get(i)).is_none_or(|k| **k != *pages[i]))
            .collect();
        self.committing = true;
        // The area's old contents are unknown from here on (some pages may be written).
        self.known[area] = None;
        Ok(CommitPlan {
            generation: sb.generation,
            area,
            pages,
            changed,
            first_page: self.label.area_start(area),
            released: self.pending_free.len(),
        })
    }

    /// The plan's writes and a flush after them completed: its generation is durable, and the
    /// clusters freed before it was prepared can be reused.
    pub fn commit_done(&mut self, plan: CommitPlan) {
        self.committing = false;
        self.generation = plan.generation;
        self.area = plan.area;
        for c in self.pending_free.drain(..plan.released) {
            self.used[c as usize / 64] &= !(1 << (c % 64));
            self.hint = self.hint.min(c as u64);
        }
        self.known[plan.area] = Some(plan.pages);
    }

    /// A write or the flush of the plan failed: nothing is known durable, the changes stay
    /// pending, and the next commit writes the whole area again.
    pub fn commit_failed(&mut self, plan: CommitPlan) {
        self.committing = false;
        drop(plan);
    }

    // ---- helpers ----
}
