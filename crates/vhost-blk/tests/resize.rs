//! A resized disk reaches the frontend: the config space reports the new capacity, and a
//! frontend that gave a backend channel (SET_BACKEND_REQ_FD) is sent
//! VHOST_USER_BACKEND_CONFIG_CHANGE_MSG on it, as QEMU needs to tell its guest.

mod common;

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::Fixture;
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;

const MIB: u64 = 1 << 20;

impl Fixture {
    /// A frontend that negotiated the config space and, when `channel` is given, the backend
    /// channel.
    fn frontend(&self, channel: Option<&UnixStream>) -> Frontend {
        let mut f = Frontend::connect(&self.sock, 1).unwrap();
        f.set_owner().unwrap();
        let features = f.get_features().unwrap();
        // All but VHOST_F_LOG_ALL (bit 26), which only a migration asks for (with LOG_SHMFD).
        f.set_features(features & !(1 << 26)).unwrap();
        let offered = f.get_protocol_features().unwrap();
        assert!(offered.contains(VhostUserProtocolFeatures::BACKEND_REQ), "{offered:?}");
        let mut want = VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::REPLY_ACK;
        if channel.is_some() {
            want |= VhostUserProtocolFeatures::BACKEND_REQ;
        }
        f.set_protocol_features(want).unwrap();
        if let Some(c) = channel {
            f.set_backend_request_fd(c).unwrap();
        }
        f
    }
}

/// The config space's `capacity` (virtio 1.2 §5.2.4: the first field, in 512-byte sectors).
fn capacity(f: &mut Frontend) -> u64 {
    let (_, payload) = f.get_config(0, 8, VhostUserConfigFlags::WRITABLE, &[0u8; 8]).unwrap();
    u64::from_le_bytes(payload[..8].try_into().unwrap())
}

#[test]
fn a_resize_is_sent_on_the_backend_channel_and_shows_in_the_config_space() {
    let f = Fixture::new();
    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut front = f.frontend(Some(&theirs));
    // A request with a reply: the server has handled SET_BACKEND_REQ_FD before answering.
    assert_eq!(capacity(&mut front), MIB / 512);

    assert!(f.ctrl().resize(2 * MIB), "a frontend with a backend channel is told");
    let mut msg = [0u8; 12];
    ours.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (&ours).read_exact(&mut msg).unwrap();
    let word = |m: &[u8; 12], i: usize| u32::from_le_bytes(m[i..i + 4].try_into().unwrap());
    // VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, version 1 without NEED_REPLY, no body.
    assert_eq!((word(&msg, 0), word(&msg, 4), word(&msg, 8)), (2, 1, 0));
    assert_eq!(capacity(&mut front), 2 * MIB / 512);

    // Shrinking is told the same way; a size that is not whole sectors rounds down.
    assert!(f.ctrl().resize(MIB / 2 + 100));
    (&ours).read_exact(&mut msg).unwrap();
    assert_eq!(word(&msg, 0), 2);
    assert_eq!(capacity(&mut front), MIB / 2 / 512);
}

#[test]
fn without_a_backend_channel_only_the_config_space_changes() {
    let f = Fixture::new();
    let mut front = f.frontend(None);
    assert!(!f.ctrl().resize(3 * MIB));
    assert_eq!(capacity(&mut front), 3 * MIB / 512);
    // The next frontend, after this one leaves, sees the new size too.
    drop(front);
    let mut next = f.frontend(None);
    assert_eq!(capacity(&mut next), 3 * MIB / 512);
}

#[test]
fn a_frontend_that_never_reads_its_channel_does_not_block_the_caller() {
    let f = Fixture::new();
    let (_ours, theirs) = UnixStream::pair().unwrap();
    let mut front = f.frontend(Some(&theirs));
    capacity(&mut front);
    // Fill the channel: every call returns at once; once full, the controller stops telling.
    let mut told = 0;
    for i in 0..100_000u64 {
        if !f.ctrl().resize(MIB + i * 512) {
            break;
        }
        told += 1;
    }
    assert!(told > 0 && told < 100_000, "told {told} times");
    assert!(!f.ctrl().resize(MIB), "the channel was dropped after the failed send");
    assert_eq!(capacity(&mut front), MIB / 512);
}

#[test]
fn a_backend_channel_that_is_not_a_stream_socket_is_refused() {
    let f = Fixture::new();
    let not_a_socket = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
    let mut front = f.frontend(None);
    front
        .set_protocol_features(VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::BACKEND_REQ)
        .unwrap();
    // `vhost` drops the connection over it; the controller keeps nothing of it.
    let _ = front.set_backend_request_fd(&not_a_socket);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while f.ctrl().info().connected {
        assert!(std::time::Instant::now() < deadline, "the connection stayed up");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!f.ctrl().resize(2 * MIB));
    // The next frontend gets the new size and a working channel.
    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut next = f.frontend(Some(&theirs));
    assert_eq!(capacity(&mut next), 2 * MIB / 512);
    assert!(f.ctrl().resize(MIB));
    let mut msg = [0u8; 12];
    ours.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (&ours).read_exact(&mut msg).unwrap();
    assert_eq!(msg[0], 2);
}
