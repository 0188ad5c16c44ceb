//! Admin commands: to the controller, their data and completion back to the host.

use super::*;

impl Executor {
    pub(crate) fn admin_command<T: Transport>(&mut self, t: &mut T, i: u16) -> Result<(), SubmitError> {
        let sqe = t.command(i).sqe;
        if sqe.opcode() == OPC_FABRICS && sqe.fctype() == FCTYPE_CONNECT {
            self.complete(t, i, Status::generic(SC_COMMAND_SEQUENCE_ERROR));
            return Ok(());
        }
        if is_auth(&sqe) {
            self.auth_command(t, i);
            return Ok(());
        }
        self.refresh_view();
        let c = t.command(i);
        let data_in: &[u8] = match (&c.buf, c.len) {
            (Some(b), n) if n > 0 && c.received == n => &b.bytes()[..n],
            _ => &[],
        };
        let ctrl = self.admin.as_mut().expect("an admin queue");
        let r = ctrl.admin(&sqe, data_in, &self.view, Instant::now());
        self.publish_state();
        match r {
            AdminResult::Parked => {
                t.command(i).phase = Phase::Parked;
            }
            AdminResult::Complete { cqe, data } => self.admin_reply(t, i, cqe, &data),
            AdminResult::Complete2 { cqe, teardown } => {
                self.respond(t, i, cqe);
                if teardown {
                    self.teardown = true;
                }
            }
        }
        Ok(())
    }

    /// Sends an admin command's data (at most what its SGL asks) and its completion.
    pub(crate) fn admin_reply<T: Transport>(&mut self, t: &mut T, i: u16, cqe: Cqe, data: &[u8]) {
        let c = t.command(i);
        let sgl = c.sqe.sgl();
        let n = data.len().min(sgl.length() as usize);
        if n > 0 && cqe.status.is_success() && sgl.type_byte() == SGL_TRANSPORT {
            c.buffer(n).bytes_mut()[..n].copy_from_slice(&data[..n]);
            // The completion follows (its dword 0 may say something).
            t.send_data(i, n, false);
        }
        self.respond(t, i, cqe);
    }
}
