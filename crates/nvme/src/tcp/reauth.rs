//! Re-authentication of live I/O queues in band (`bdev_nvme_set_keys`): the transport's
//! [`AuthShared`] holds the keys and an epoch the key change moves on; each I/O queue sees the
//! new epoch at its next poll (a call and one relaxed load per poll round) and runs the DH-HMAC-CHAP
//! transaction ([`super::auth::HostTransaction`]) between its I/O, one step per completion:
//! Authentication Send and Receive under a tag of their own, into a buffer of the run's. While
//! it runs the queue refuses new I/O with `Busy` (the channel holds and resends it: a
//! controller may fail commands on a queue being re-authenticated, as Linux's nvmet does);
//! commands already in flight complete as usual. The keys are copied once per run, so nothing
//! is allocated or locked per I/O. A refusal sends AUTH_Failure2 when the host refused, then
//! the queue dies, as SPDK's host fails the queue pair: its channel hands it back and the
//! controller resets, with the new keys. Each run is bounded by [`REAUTH_TIMEOUT`] and reports
//! its outcome to the waiting RPC through [`AuthShared`].

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fp_bdev::iov::BounceBuf;
use fp_nvme_spec::auth::{AuthCommand, MAX_DHCHAP_MESSAGE_LEN};
use fp_nvme_spec::Cqe;

use super::auth::{self, AuthState, DhchapHost, HostTransaction, QueueAuth, Refusal};
use super::queue::{Dir, Reauthenticate, TcpQueue, AUTH_TAG};
use crate::NvmeError;

/// How long one queue's re-authentication may take.
pub(super) const REAUTH_TIMEOUT: Duration = Duration::from_secs(10);

/// The outcomes of the I/O queues' runs of the current epoch.
#[derive(Debug, Default)]
struct Outcomes {
    epoch: u64,
    ok: usize,
    failed: usize,
    /// The first failure, for the RPC's error.
    first_error: Option<String>,
}

/// What a transport and its I/O queues share for authentication.
#[derive(Debug)]
pub(super) struct AuthShared {
    /// The keys and offer queues authenticate with now.
    host: Mutex<DhchapHost>,
    /// Moved on by each key change that re-authenticates the queues.
    epoch: AtomicU64,
    /// The next transaction's identifier: each queue's is its own.
    next_t_id: AtomicU16,
    hostnqn: String,
    subnqn: String,
    outcomes: Mutex<Outcomes>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl AuthShared {
    pub(super) fn new(host: DhchapHost, hostnqn: &str, subnqn: &str) -> AuthShared {
        AuthShared {
            host: Mutex::new(host),
            epoch: AtomicU64::new(0),
            next_t_id: AtomicU16::new(0),
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            outcomes: Mutex::new(Outcomes::default()),
        }
    }

    /// The keys and offer now.
    pub(super) fn host(&self) -> DhchapHost {
        lock(&self.host).clone()
    }

    /// Replaces the keys (the offer stays).
    pub(super) fn set_keys(
        &self,
        key: Option<fp_crypto::dhchap::DhchapSecret>,
        ctrlr_key: Option<fp_crypto::dhchap::DhchapSecret>,
    ) {
        let mut h = lock(&self.host);
        h.key = key;
        h.ctrlr_key = ctrlr_key;
    }

    /// A new transaction identifier.
    pub(super) fn t_id(&self) -> u16 {
        self.next_t_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(super) fn hostnqn(&self) -> &str {
        &self.hostnqn
    }

    pub(super) fn subnqn(&self) -> &str {
        &self.subnqn
    }

    /// The epoch a queue connected now starts at (it authenticated with the keys of now).
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Makes every I/O queue authenticate again with the keys now and waits, up to `timeout`,
    /// for `queues` outcomes; the first failure is the error.
    pub(super) fn reauthenticate(&self, queues: usize, timeout: Duration) -> Result<(), NvmeError> {
        let epoch = {
            let mut o = lock(&self.outcomes);
            let epoch = self.epoch.load(Ordering::Relaxed) + 1;
            *o = Outcomes { epoch, ..Outcomes::default() };
            self.epoch.store(epoch, Ordering::Release);
            epoch
        };
        let deadline = Instant::now() + timeout;
        loop {
            {
                let o = lock(&self.outcomes);
                if o.epoch != epoch {
                    return Err(NvmeError::Auth("the keys changed again meanwhile".into()));
                }
                if let Some(e) = &o.first_error {
                    return Err(NvmeError::Auth(e.clone()));
                }
                if o.ok >= queues {
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    return Err(NvmeError::Timeout(format!(
                        "{} of {queues} I/O queues authenticated again within {timeout:?}",
                        o.ok
                    )));
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A queue's outcome for `epoch` (once per queue and run, not per I/O).
    fn report(&self, epoch: u64, r: Result<(), &NvmeError>) {
        let mut o = lock(&self.outcomes);
        if o.epoch != epoch {
            return;
        }
        match r {
            Ok(()) => o.ok += 1,
            Err(e) => {
                o.failed += 1;
                o.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// What the queue waits for.
enum Awaiting {
    NegotiateSent,
    Challenge,
    ReplySent,
    Success1,
    Success2Sent,
    /// AUTH_Failure2 is on its way; then the queue fails with this.
    Failure2Sent(NvmeError),
}

/// The next command to submit (when the queue had no free slot, it waits for the next poll).
#[derive(Clone, Copy)]
enum Next {
    /// Authentication Send of the buffer's first bytes.
    Send(usize),
    /// Authentication Receive into the whole buffer.
    Receive,
}

/// One run of the transaction on the queue.
struct Run {
    epoch: u64,
    host: DhchapHost,
    t_id: u16,
    state: AuthState,
    awaiting: Awaiting,
    next: Option<Next>,
    /// The message sent or received (the queue's command points into it while it runs).
    buf: BounceBuf,
    deadline: Instant,
}

impl Run {
    /// Submits `next`, then waits for `awaiting`.
    fn then(&mut self, next: Next, awaiting: Awaiting) -> Result<bool, NvmeError> {
        self.next = Some(next);
        self.awaiting = awaiting;
        Ok(false)
    }

    /// Sends `msg`, then waits for `awaiting`.
    fn send(&mut self, msg: &[u8], awaiting: Awaiting) -> Result<bool, NvmeError> {
        self.buf.bytes_mut()[..msg.len()].copy_from_slice(msg);
        self.then(Next::Send(msg.len()), awaiting)
    }
}

/// An I/O queue's part: the epoch it authenticated at and the run under way.
pub(super) struct QueueReauth {
    shared: Arc<AuthShared>,
    epoch: u64,
    run: Option<Run>,
}

impl QueueReauth {
    pub(super) fn new(shared: Arc<AuthShared>, epoch: u64) -> QueueReauth {
        QueueReauth { shared, epoch, run: None }
    }
}

impl Reauthenticate for QueueReauth {
    /// Whether the keys changed since the queue authenticated, or a run is under way: one
    /// relaxed load when neither.
    #[inline]
    fn due(&self) -> bool {
        self.run.is_some() || self.shared.epoch.load(Ordering::Relaxed) != self.epoch
    }

    /// Advances the run: starts it when the epoch moved, handles the completion of its
    /// command (`cqe`), submits its next command, checks its deadline. An error is the queue's
    /// death.
    fn step(&mut self, q: &mut TcpQueue, cqe: Option<Cqe>) -> Result<(), NvmeError> {
        if self.run.is_none() {
            self.start(q);
        }
        let qid = q.params().qid;
        let Some(run) = self.run.as_mut() else { return Ok(()) };
        let handled = match cqe {
            Some(c) => handle(run, qid, &self.shared, &c),
            None if Instant::now() >= run.deadline => {
                Err(NvmeError::Timeout(format!("queue {qid}: re-authentication (over {REAUTH_TIMEOUT:?})")))
            }
            None => Ok(false),
        };
        match handled {
            Ok(true) => {
                self.epoch = run.epoch;
                self.shared.report(run.epoch, Ok(()));
                self.run = None;
                q.set_holding(false);
                log::info!("nvme tcp queue {qid}: authenticated again (DH-HMAC-CHAP)");
                return Ok(());
            }
            Ok(false) => {}
            Err(e) => return Err(self.fail(q, e)),
        }
        if let Some(next) = run.next {
            let (sqe, iov, dir) = match next {
                Next::Send(len) => (
                    AuthCommand { send: true, length: len as u32 }.to_sqe(0),
                    run.buf.iovecs(len),
                    Dir::ToDevice,
                ),
                Next::Receive => {
                    run.buf.bytes_mut().fill(0);
                    let len = run.buf.len();
                    (
                        AuthCommand { send: false, length: len as u32 }.to_sqe(0),
                        run.buf.iovecs(len),
                        Dir::FromDevice,
                    )
                }
            };
            // No free slot (the queue is full of I/O): again at the next poll.
            if q.submit_dir(&sqe, iov, dir, AUTH_TAG).is_ok() {
                run.next = None;
                q.send()?;
            }
        }
        Ok(())
    }

    fn lost(&mut self, qid: u16, e: NvmeError) -> NvmeError {
        let Some(run) = self.run.take() else { return e };
        let e = match run.awaiting {
            Awaiting::Success1 => {
                let a = queue_auth(&self.shared, qid, run.t_id);
                auth::closed_after_reply(&a, Refusal { error: e, failure2: None }).error
            }
            _ => e,
        };
        self.shared.report(run.epoch, Err(&e));
        self.epoch = run.epoch;
        e
    }
}

impl QueueReauth {
    /// Starts a run with the keys now: the Negotiate goes first. Without a host key (the keys
    /// were cleared) nothing runs.
    fn start(&mut self, q: &mut TcpQueue) {
        let epoch = self.shared.epoch.load(Ordering::Acquire);
        if epoch == self.epoch {
            return;
        }
        let host = self.shared.host();
        let Some(key) = host.key.as_ref() else {
            self.epoch = epoch;
            self.shared.report(epoch, Ok(()));
            return;
        };
        let t_id = self.shared.t_id();
        let a = queue_auth(&self.shared, q.params().qid, t_id);
        let negotiate = HostTransaction::new(key, &host, &a).negotiate();
        let mut buf = BounceBuf::zeroed(MAX_DHCHAP_MESSAGE_LEN);
        buf.bytes_mut()[..negotiate.len()].copy_from_slice(&negotiate);
        self.run = Some(Run {
            epoch,
            host,
            t_id,
            state: None,
            awaiting: Awaiting::NegotiateSent,
            next: Some(Next::Send(negotiate.len())),
            buf,
            deadline: Instant::now() + REAUTH_TIMEOUT,
        });
        q.set_holding(true);
    }

    /// The run failed: reported, and the queue dies with `e`.
    fn fail(&mut self, q: &mut TcpQueue, e: NvmeError) -> NvmeError {
        if let Some(run) = self.run.take() {
            self.shared.report(run.epoch, Err(&e));
            self.epoch = run.epoch;
        }
        q.set_holding(false);
        q.fail(e)
    }
}

fn queue_auth(shared: &AuthShared, qid: u16, t_id: u16) -> QueueAuth<'_> {
    QueueAuth { qid, t_id, hostnqn: shared.hostnqn(), subnqn: shared.subnqn(), timeout: REAUTH_TIMEOUT }
}

/// Handles the completion of the run's command: `Ok(true)` when the queue is authenticated,
/// `Ok(false)` with the next command set, an error when the run failed.
fn handle(run: &mut Run, qid: u16, shared: &AuthShared, c: &Cqe) -> Result<bool, NvmeError> {
    use auth::{CHALLENGE, NEGOTIATE, REPLY, SUCCESS1, SUCCESS2};
    let status = |step: &str| {
        if c.status.is_success() {
            Ok(())
        } else {
            Err(auth::step_error(
                qid,
                step,
                format!(
                    "Authentication Send/Receive failed with sct {:#x} sc {:#x}",
                    c.status.sct, c.status.sc
                ),
            ))
        }
    };
    let awaiting = std::mem::replace(&mut run.awaiting, Awaiting::Success2Sent);
    let key = run.host.key.clone().expect("a run has a host key");
    let a = queue_auth(shared, qid, run.t_id);
    let refused = |run: &mut Run, r: Refusal| -> Result<bool, NvmeError> {
        let Some(reason) = r.failure2 else { return Err(r.error) };
        run.send(&auth::failure2(run.t_id, reason), Awaiting::Failure2Sent(r.error))
    };
    match awaiting {
        Awaiting::NegotiateSent => {
            status(NEGOTIATE).and_then(|()| run.then(Next::Receive, Awaiting::Challenge))
        }
        Awaiting::Challenge => {
            status(CHALLENGE)?;
            let mut t = HostTransaction::resume(&key, &run.host, &a, run.state.take());
            let reply = t.challenge(run.buf.bytes());
            run.state = t.into_state();
            match reply {
                Ok(reply) => run.send(&reply, Awaiting::ReplySent),
                Err(r) => refused(run, r),
            }
        }
        Awaiting::ReplySent => status(REPLY).and_then(|()| run.then(Next::Receive, Awaiting::Success1)),
        Awaiting::Success1 => {
            status(SUCCESS1)?;
            let mut t = HostTransaction::resume(&key, &run.host, &a, run.state.take());
            match t.success1(run.buf.bytes()) {
                Ok(None) => Ok(true),
                Ok(Some(s2)) => run.send(&s2, Awaiting::Success2Sent),
                Err(r) => refused(run, r),
            }
        }
        Awaiting::Success2Sent => status(SUCCESS2).map(|()| true),
        Awaiting::Failure2Sent(e) => Err(e),
    }
}
