//! The libblkio back end: libblkio's virtio-blk-vhost-user driver, which negotiates split
//! virtqueues only.

use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;

use blkio::{Blkio, Blkioq, Completion, MemoryRegion, ReqFlags};
use fp_virtq::driver::SharedMem;

use super::backend::{
    check_geometry, queue_size_for, round_up, Backend, CompletionFd, Connected, Done, IoQueue, Req, BUF_ALIGN,
};
use super::virtio::alloc_shared;
use crate::{LoadError, LoadSpec};

fn bk(op: &'static str) -> impl FnOnce(blkio::Error) -> LoadError {
    move |e| LoadError::blkio(op, e)
}

/// The libblkio instance and the buffer region, mapped with it. Dropped after the queues (see
/// [`super::Device`]), as libblkio expects; the memory after libblkio.
pub(super) struct Libblkio {
    blkio: Blkio,
    region: MemoryRegion,
    _mem: Arc<SharedMem>,
}

impl Drop for Libblkio {
    fn drop(&mut self) {
        self.blkio.unmap_mem_region(&self.region);
    }
}

pub(super) struct LibblkioQueue {
    q: Blkioq,
    completions: Vec<MaybeUninit<Completion>>,
}

impl IoQueue for LibblkioQueue {
    #[inline]
    fn enqueue(&mut self, r: Req) -> Result<(), LoadError> {
        let buf = r.buf as *mut u8;
        if r.write {
            self.q.write(r.offset, buf, r.len, r.slot, ReqFlags::empty());
        } else {
            self.q.read(r.offset, buf, r.len, r.slot, ReqFlags::empty());
        }
        Ok(())
    }

    #[inline]
    #[allow(unsafe_code)] // libblkio's API: completions in caller-provided `MaybeUninit`s.
    fn reap(&mut self, out: &mut [Done]) -> Result<usize, LoadError> {
        let room = out.len().min(self.completions.len());
        let n = self.q.do_io(&mut self.completions[..room], 0, None, None).map_err(bk("do_io"))?;
        for (o, c) in out.iter_mut().zip(&self.completions[..n]) {
            // SAFETY: do_io() initialised the first `n` elements.
            let c = unsafe { c.assume_init_ref() };
            *o = Done { slot: c.user_data, ret: c.ret };
        }
        Ok(n)
    }

    #[allow(unsafe_code)] // libblkio's API: the completion eventfd as a bare number.
    fn enable_completion_fd(&mut self) -> Result<CompletionFd, LoadError> {
        let fd = self
            .q
            .get_completion_fd()
            .ok_or_else(|| LoadError::InvalidSpec("a completion-fd queue has no completion fd".into()))?;
        // SAFETY: libblkio's completion eventfd, open for the queue's lifetime, which outlives
        // this borrow (the duplicate is the waiter's own).
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let fd = fd.try_clone_to_owned().map_err(|source| LoadError::Os { op: "dup", source })?;
        self.q.set_completion_fd_enabled(true);
        Ok(CompletionFd::Owned(fd))
    }
}

impl Backend for Libblkio {
    type Queue = LibblkioQueue;

    fn connect(spec: &LoadSpec, buf_len: usize) -> Result<Connected<Self>, LoadError> {
        let mut blkio = Blkio::new("virtio-blk-vhost-user").map_err(bk("new"))?;
        let path = spec
            .socket
            .to_str()
            .ok_or_else(|| LoadError::InvalidSpec(format!("socket path {:?} is not UTF-8", spec.socket)))?;
        blkio.set_str("path", path).map_err(bk("set path"))?;
        if spec.read_only || spec.pattern.is_read_only() {
            blkio.set_bool("read-only", true).map_err(bk("set read-only"))?;
        }
        blkio.connect().map_err(bk("connect"))?;

        let capacity = blkio.get_u64("capacity").map_err(bk("get capacity"))?;
        let request_alignment = blkio.get_i32("request-alignment").map_err(bk("get request-alignment"))?;
        let max_queues = blkio.get_i32("max-queues").map_err(bk("get max-queues"))?;
        let request_alignment = u32::try_from(request_alignment.max(1)).unwrap_or(512);
        check_geometry(spec, request_alignment, max_queues.max(0) as usize)?;

        let n = spec.num_queues as i32;
        let (fd_queues, poll_queues) = if spec.poll_queues { (0, n) } else { (n, 0) };
        blkio.set_i32("num-queues", fd_queues).map_err(bk("set num-queues"))?;
        blkio.set_i32("num-poll-queues", poll_queues).map_err(bk("set num-poll-queues"))?;
        let queue_size = queue_size_for(spec.queue_depth);
        blkio.set_i32("queue-size", queue_size as i32).map_err(bk("set queue-size"))?;
        let started = blkio.start().map_err(|e| {
            let mut err = LoadError::blkio("start", e);
            if let LoadError::Blkio { message, .. } = &mut err {
                if queue_size > 256 {
                    message.push_str(&format!(
                        "; queue depth {} needs virtqueues of {queue_size} entries (3 descriptors \
                         per request), which the device may refuse: try a lower queue depth",
                        spec.queue_depth
                    ));
                }
            }
            err
        })?;
        let queues = if spec.poll_queues { started.poll_queues } else { started.queues };

        let align = blkio.get_u64("mem-region-alignment").map_err(bk("get mem-region-alignment"))? as usize;
        let len = round_up(buf_len, align.max(BUF_ALIGN));
        // The memory libblkio's `alloc_mem_region` makes (a page-aligned memfd mapping at IOVA
        // 0), but owned here, so that the loop reaches it through safe views.
        let mem = Arc::new(alloc_shared(len, false)?);
        let region =
            MemoryRegion { addr: mem.addr(), iova: 0, len, fd: mem.fd().as_raw_fd(), fd_offset: 0, flags: 0 };
        if region.addr % align.max(1) != 0 {
            return Err(LoadError::InvalidSpec(format!(
                "the buffer region violates mem-region-alignment {align}"
            )));
        }
        blkio.map_mem_region(&region).map_err(bk("map_mem_region"))?;
        let data = mem.view();

        let queues = queues
            .into_iter()
            .map(|q| LibblkioQueue {
                q,
                completions: (0..spec.queue_depth).map(|_| MaybeUninit::uninit()).collect(),
            })
            .collect();
        Ok(Connected {
            queues,
            backend: Libblkio { blkio, region, _mem: mem },
            data,
            capacity,
            request_alignment,
        })
    }
}
