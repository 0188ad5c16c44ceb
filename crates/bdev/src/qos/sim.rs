//! Test harness: channels that always have a request waiting, driven on one thread in a fixed
//! order against a fake time line (the "reactors" of the accuracy tests).

use super::Wait;

/// One flooding channel: `admit(now)` asks its QoS state whether the next request may go.
pub(crate) struct Channel<'a> {
    admit: Box<dyn FnMut(u64) -> Result<(), Wait> + 'a>,
    ready: u64,
}

impl<'a> Channel<'a> {
    pub(crate) fn new(admit: impl FnMut(u64) -> Result<(), Wait> + 'a) -> Channel<'a> {
        Channel { admit: Box::new(admit), ready: 0 }
    }
}

/// Requests admitted per channel between ticks `start` and `end`. Time jumps to the earliest
/// tick a waiting channel was told to retry from; at each tick the ready channels take one
/// request each in turn (two reactors interleaving) until every one of them is refused.
pub(crate) fn flood(chs: &mut [Channel<'_>], start: u64, end: u64) -> Vec<u64> {
    let mut count = vec![0u64; chs.len()];
    for c in chs.iter_mut() {
        c.ready = start;
    }
    let mut rotation = 0;
    loop {
        let now = chs.iter().map(|c| c.ready).min().expect("channels");
        if now >= end {
            return count;
        }
        let mut turns = 0u64;
        loop {
            let mut any = false;
            // Each round starts with the next channel: no channel is always first.
            let k = chs.len();
            for j in 0..k {
                let i = (j + rotation) % k;
                let c = &mut chs[i];
                if c.ready > now {
                    continue;
                }
                match (c.admit)(now) {
                    Ok(()) => {
                        count[i] += 1;
                        any = true;
                    }
                    Err(Wait(at)) => {
                        assert!(at > now, "a refusal must name a later tick ({at} <= {now})");
                        c.ready = at;
                    }
                }
            }
            turns += 1;
            rotation += 1;
            if !any {
                break;
            }
            assert!(turns < 50_000_000, "no limit in force");
        }
    }
}
