//! DH-HMAC-CHAP on a live queue: a host authenticates again (the kernel does when its secrets
//! change) while its I/O goes on. Each AUTH_Negotiate starts a transaction with the keys and
//! the hashes and groups the subsystem and the target have at that moment, so after
//! `nvmf_subsystem_set_keys` the controller answers with the new keys. The commands reach this
//! only through the admin queue's fabrics branch and the I/O path's refusal branch, so the data
//! path costs nothing more. The DH computation runs on the reactor, as SPDK's runs on its
//! thread: about 0.6 ms at ffdhe2048 and up to ~20 ms at ffdhe8192, once per queue per
//! re-authentication. A refused transaction closes the queue once the host has its
//! AUTH_Failure1 (as SPDK does); the host reconnects and authenticates from the start.

use fp_nvme_spec::auth::{AuthCommand, AuthMessage};

use super::*;

impl Executor {
    /// Command `i`, an Authentication Send or Receive on the live queue.
    pub(crate) fn auth_command<T: Transport>(&mut self, t: &mut T, i: u16) {
        let sqe = t.command(i).sqe;
        let cmd = match AuthCommand::from_sqe(&sqe) {
            Ok(cmd) => cmd,
            Err(e) => {
                log::info!("nvmf: {}: {e}", self.what());
                return self.complete(t, i, Status::generic(SC_INVALID_FIELD));
            }
        };
        if cmd.send {
            let c = t.command(i);
            let n = cmd.length as usize;
            let data = match &c.buf {
                Some(b) if c.received == c.len && n <= c.len => b.bytes()[..n].to_vec(),
                _ => return self.complete(t, i, Status::generic(SC_SGL_DATA_LENGTH_INVALID)),
            };
            self.auth_send(&data);
            self.complete(t, i, Status::SUCCESS);
        } else {
            let Some(m) = self.reauth.as_mut().and_then(|a| a.on_receive()) else {
                return self.complete(t, i, Status::generic(SC_COMMAND_SEQUENCE_ERROR));
            };
            let mut msg = vec![0u8; m.encoded_len()];
            let n = m.encode(&mut msg).expect("a message fits its own length");
            msg.truncate(n.min(cmd.length as usize));
            self.admin_reply(t, i, Cqe::new(0, Status::SUCCESS), &msg);
            if self.reauth_failed && !self.reauth.as_ref().is_some_and(|a| a.has_outgoing()) {
                self.close_after_failure();
            }
        }
        self.reauth_done();
    }

    /// The host's message: a Negotiate starts a new transaction with the current keys.
    fn auth_send(&mut self, data: &[u8]) {
        let hostnqn = &self.ctrl.hostnqn.clone();
        if self.reauth.is_none() || matches!(AuthMessage::parse(data), Ok(AuthMessage::Negotiate(_))) {
            let keys = lock(&self.sub.state).host_keys.get(hostnqn).cloned();
            let config = lock(&self.dhchap).clone();
            self.reauth = Some(Box::new(Authenticator::new(keys, config, hostnqn, &self.sub.nqn)));
            self.reauth_failed = false;
        }
        let a = self.reauth.as_mut().expect("made above");
        let result = a.on_send(data);
        let queued = a.has_outgoing();
        if let Err(r) = result {
            log::warn!(
                "nvmf: {}: host {hostnqn} failed DH-HMAC-CHAP again on its live queue: {} ({:?})",
                self.what(),
                r.why,
                r.reason
            );
            self.reauth_failed = true;
            if !queued {
                // The host gave up (AUTH_Failure2): nothing more to tell it.
                self.close_after_failure();
            }
        }
    }

    fn close_after_failure(&mut self) {
        self.reauth = None;
        self.teardown = true;
        self.teardown_why = "the host failed to authenticate again";
    }

    /// A transaction that succeeded: logged, and shown in `nvmf_subsystem_get_qpairs`.
    fn reauth_done(&mut self) {
        let Some(negotiated) = self.reauth.as_ref().filter(|a| a.authenticated()).map(|a| a.negotiated())
        else {
            return;
        };
        self.reauth = None;
        log::info!("nvmf: {}: host {} authenticated again", self.what(), self.ctrl.hostnqn);
        let mut st = lock(&self.sub.state);
        if let Some(e) = st.controllers.get_mut(&self.ctrl.cntlid) {
            let q = if self.qid == 0 { e.admin.as_mut() } else { e.io.get_mut(&self.qid) };
            if let Some(q) = q {
                q.auth = negotiated;
            }
        }
    }
}
