//! Admin commands: to the controller, their data and completion back to the host.

use super::*;

impl QpairPoller {
    pub(crate) fn admin_command(&mut self, i: u16) -> Result<(), SubmitError> {
        let sqe = self.slots[i as usize].sqe;
        if sqe.opcode() == OPC_FABRICS && sqe.fctype() == FCTYPE_CONNECT {
            self.complete(i, Status::generic(SC_COMMAND_SEQUENCE_ERROR));
            return Ok(());
        }
        self.refresh_view();
        let s = &self.slots[i as usize];
        let data_in: &[u8] = match (&s.buf, s.len) {
            (Some(b), n) if n > 0 && s.received == n => &b.bytes()[..n],
            _ => &[],
        };
        let ctrl = self.admin.as_mut().expect("an admin queue");
        let r = ctrl.admin(&sqe, data_in, &self.view, Instant::now());
        self.publish_state();
        self.arm_keep_alive();
        match r {
            AdminResult::Parked => {
                self.slots[i as usize].phase = Phase::Parked;
            }
            AdminResult::Complete { cqe, data } => self.admin_reply(i, cqe, &data),
            AdminResult::Complete2 { cqe, teardown } => {
                self.respond(i, cqe);
                if teardown {
                    self.teardown = true;
                }
            }
        }
        Ok(())
    }

    /// Sends an admin command's data (at most what its SGL asks) and its completion.
    pub(crate) fn admin_reply(&mut self, i: u16, cqe: Cqe, data: &[u8]) {
        let sgl = self.slots[i as usize].sqe.sgl();
        let n = data.len().min(sgl.length() as usize);
        if n > 0 && cqe.status.is_success() && sgl.type_byte() == SGL_TRANSPORT {
            let s = &mut self.slots[i as usize];
            s.buffer(n).bytes_mut()[..n].copy_from_slice(&data[..n]);
            self.queue_c2h(i, n, false);
        }
        self.respond(i, cqe);
    }
}
