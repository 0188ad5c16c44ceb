//! A request's buffers as `std::io` slices, so a stream connection moves a request's bytes
//! straight between them and its socket (zero copy) in one vectored call, with no unsafe code
//! of its own: a `Write`'s bytes as shared slices to gather into a send, a `Read`'s as
//! mutable slices for one receive.
//!
//! The promise that makes these views sound is the one [`Iovecs::from_raw`]'s caller made:
//! while the request is in flight its buffers are the channel's alone (a `Read`'s, whose
//! iovecs describe distinct bytes) or written by nobody (a `Write`'s). A channel uses them
//! only for requests it holds.

use std::io::IoSliceMut;

use crate::iov::Iovecs;

/// Most of a request's buffers one [`with_slices_mut`] view holds; a range spread over more
/// is cut there (the caller moves on by what its call took).
pub const VIEW_MAX: usize = 64;

/// The bytes of a `Write`'s buffers in `offset..offset + len`, piece by piece (fewer when the
/// iovecs end first): see [`pieces`].
#[derive(Clone)]
pub struct Pieces<'a> {
    iov: std::slice::Iter<'a, libc::iovec>,
    skip: usize,
    left: usize,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        while self.left > 0 {
            let v = self.iov.next()?;
            if self.skip >= v.iov_len {
                self.skip -= v.iov_len;
                continue;
            }
            let n = (v.iov_len - self.skip).min(self.left);
            // SAFETY: `[skip, skip + n)` lies inside the iovec, readable and written by no one
            // while the request is in flight (`Iovecs`' contract); a channel looks at a
            // request's buffers only while it holds the request (this module's rule).
            let piece = unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>().add(self.skip), n) };
            self.skip = 0;
            self.left -= n;
            return Some(piece);
        }
        None
    }
}

/// The bytes of `iov` from byte `offset`, `len` of them, as slices: a `Write`'s data for a
/// gathered send (for `Write` requests only: nothing writes their buffers while they are in
/// flight, so shared views of them alias nothing).
#[inline]
pub fn pieces(iov: &Iovecs, offset: usize, len: usize) -> Pieces<'_> {
    Pieces { iov: iov.as_slice().iter(), skip: offset, left: len }
}

/// Calls `f` with the bytes of `iov` from byte `offset`, `len` of them, as mutable slices (at
/// most [`VIEW_MAX`]; fewer when the iovecs end first), followed by `tail` when the whole range
/// fit: a `Read`'s data and, after it, room for the next header, filled by one receive. The
/// views live only for the call; the channel holding the `Read` is the only one touching its
/// buffers (`Iovecs`' contract), and `f` must not reach them any other way meanwhile.
#[inline]
pub fn with_slices_mut<R>(
    iov: &Iovecs,
    offset: usize,
    len: usize,
    tail: &mut [u8],
    f: impl FnOnce(&mut [IoSliceMut<'_>]) -> R,
) -> R {
    // Most requests have a buffer or a few: their view is a small array, cheap to set up
    // for every receive.
    if iov.count() < FEW as u32 {
        let (mut bufs, n) = view::<FEW>(iov, offset, len, tail);
        f(&mut bufs[..n])
    } else {
        let (mut bufs, n) = view::<{ VIEW_MAX + 1 }>(iov, offset, len, tail);
        f(&mut bufs[..n])
    }
}

/// Entries of the small view: up to three of a request's buffers and the tail.
const FEW: usize = 4;

/// The entries of [`with_slices_mut`]'s view, with room for `N - 1` of the request's buffers
/// and the tail, and how many are used. Private: the views must not outlive that call.
#[inline]
fn view<'a, const N: usize>(
    iov: &'a Iovecs,
    offset: usize,
    len: usize,
    tail: &'a mut [u8],
) -> ([IoSliceMut<'a>; N], usize) {
    let mut bufs: [IoSliceMut<'a>; N] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
    let (mut skip, mut left, mut n) = (offset, len, 0);
    for v in iov.as_slice() {
        if left == 0 || n == N - 1 {
            break;
        }
        if skip >= v.iov_len {
            skip -= v.iov_len;
            continue;
        }
        let take = (v.iov_len - skip).min(left);
        // SAFETY: `[skip, skip + take)` lies inside the iovec, writable and accessed by no one
        // but the channel holding the request (`Iovecs`' contract), which takes it as a
        // `Read`'s buffers, each byte filled once: the iovecs of a read describe distinct
        // bytes (a describer must not hand out overlapping ones for a read). The view ends with
        // the call of `with_slices_mut`, the only caller.
        bufs[n] = IoSliceMut::new(unsafe {
            std::slice::from_raw_parts_mut(v.iov_base.cast::<u8>().add(skip), take)
        });
        n += 1;
        left -= take;
        skip = 0;
    }
    if left == 0 && !tail.is_empty() {
        bufs[n] = IoSliceMut::new(tail);
        n += 1;
    }
    (bufs, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Consecutive pieces of `data`, `lens` bytes each, as iovecs.
    fn iovecs(data: &mut [u8], lens: &[usize]) -> Vec<libc::iovec> {
        let mut at = 0;
        lens.iter()
            .map(|&n| {
                let v = libc::iovec { iov_base: data[at..].as_mut_ptr().cast(), iov_len: n };
                at += n;
                v
            })
            .collect()
    }

    #[test]
    fn pieces_cover_the_range_across_iovecs() {
        let mut data: [u8; 10] = std::array::from_fn(|i| i as u8);
        let v = iovecs(&mut data, &[4, 0, 6]);
        // SAFETY: the test's own array, alive until the end.
        let iov = unsafe { Iovecs::from_slice(&v) };
        let got: Vec<&[u8]> = pieces(&iov, 2, 5).collect();
        assert_eq!(got, vec![&[2u8, 3][..], &[4, 5, 6][..]]);
        assert_eq!(pieces(&iov, 8, 10).map(<[u8]>::len).sum::<usize>(), 2, "cut where the iovecs end");
        assert_eq!(pieces(&iov, 3, 0).count(), 0);
    }

    #[test]
    fn a_mutable_view_takes_the_tail_only_when_the_range_fit() {
        let mut data = [0u8; 10];
        let v = iovecs(&mut data, &[4, 0, 6]);
        // SAFETY: as above.
        let iov = unsafe { Iovecs::from_slice(&v) };
        let mut tail = [0u8; 3];
        let lens = with_slices_mut(&iov, 3, 5, &mut tail, |b| {
            b.iter_mut().flat_map(|s| s.iter_mut()).zip(1..).for_each(|(x, i)| *x = i);
            b.iter().map(|s| s.len()).collect::<Vec<_>>()
        });
        assert_eq!(lens, vec![1, 4, 3]);
        assert_eq!(data, [0, 0, 0, 1, 2, 3, 4, 5, 0, 0]);
        assert_eq!(tail, [6, 7, 8]);

        // More iovecs than a view holds: cut at VIEW_MAX, and no tail.
        let mut many = [0u8; VIEW_MAX + 2];
        let v = iovecs(&mut many, &[1; VIEW_MAX + 2]);
        // SAFETY: one byte of the test's own array each, alive until the end.
        let iov = unsafe { Iovecs::from_slice(&v) };
        let n = with_slices_mut(&iov, 0, VIEW_MAX + 2, &mut tail, |b| b.len());
        assert_eq!(n, VIEW_MAX);
    }
}
