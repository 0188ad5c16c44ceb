//! A loopback NVMe/TCP target for other crates' tests (cargo feature `testing`): reactors of
//! its own, the TCP transport, and subsystems that any host may connect to on one port of
//! 127.0.0.1, each with namespace 1 over a given bdev. Dropping it stops the target and its
//! reactors. fp-nvmf's own tests start their targets with it too, except where a test checks
//! the target's own setup.

use fp_bdev::Bdev;
use fp_reactor::{ReactorConfig, ReactorSet};

use crate::{
    ListenAddress, NamespaceSpec, NvmfError, NvmfTarget, SubsystemSpec, TargetOptions, TransportOptions,
};

/// Why a loopback target could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    #[error("starting the test target's reactors: {0}")]
    Reactors(std::io::Error),
    #[error("choosing a loopback port: {0}")]
    Port(std::io::Error),
    #[error(transparent)]
    Target(#[from] NvmfError),
}

/// A running target on 127.0.0.1; stopped, with its reactors, on drop.
pub struct LoopbackTarget {
    target: NvmfTarget,
    port: u16,
    reactors: Option<ReactorSet>,
}

impl LoopbackTarget {
    /// A target with the TCP transport (`opts`) on reactors pinned to `cpus`, and a loopback
    /// port for its subsystems to listen on (free when chosen).
    pub fn start(cpus: &[usize], opts: TransportOptions) -> Result<LoopbackTarget, LoopbackError> {
        let reactors = ReactorSet::start(cpus, ReactorConfig::default()).map_err(LoopbackError::Reactors)?;
        let target = NvmfTarget::new(reactors.handles().to_vec(), TargetOptions::default());
        // The guard first: a failure below still stops the reactors.
        let mut guard = LoopbackTarget { target, port: 0, reactors: Some(reactors) };
        guard.target.create_transport(opts)?;
        guard.port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(LoopbackError::Port)?
            .port();
        Ok(guard)
    }

    /// Adds subsystem `nqn` (any host may connect), listening on the target's port, with
    /// namespace 1 over `bdev` (named `bdev_name` in the target's reports).
    pub fn add_subsystem(&self, nqn: &str, bdev: Bdev, bdev_name: &str) -> Result<(), NvmfError> {
        self.target.create_subsystem(SubsystemSpec {
            nqn: nqn.into(),
            allow_any_host: true,
            ..Default::default()
        })?;
        self.target.add_listener(nqn, self.listen_address())?;
        let ns = namespace(1, bdev, bdev_name);
        self.target.add_namespace(nqn, ns)?;
        Ok(())
    }

    /// The target, for what a test does beyond [`LoopbackTarget::add_subsystem`].
    pub fn target(&self) -> &NvmfTarget {
        &self.target
    }

    /// The port its subsystems listen on, at 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The listen address of its subsystems.
    pub fn listen_address(&self) -> ListenAddress {
        ListenAddress {
            trtype: "TCP".into(),
            adrfam: "IPv4".into(),
            traddr: "127.0.0.1".into(),
            trsvcid: self.port.to_string(),
        }
    }
}

/// Namespace `nsid` over `bdev` (named `bdev_name`), writable, with no identifiers of its own.
pub fn namespace(nsid: u32, bdev: Bdev, bdev_name: &str) -> NamespaceSpec {
    NamespaceSpec {
        nsid,
        bdev,
        bdev_name: bdev_name.into(),
        uuid: None,
        nguid: None,
        eui64: None,
        read_only: false,
        anagrpid: None,
    }
}

/// A target on one reactor (CPU 0) with the default transport options and subsystem `nqn`
/// over `bdev`: the common case.
pub fn loopback_target(nqn: &str, bdev: Bdev, bdev_name: &str) -> Result<LoopbackTarget, LoopbackError> {
    let t = LoopbackTarget::start(&[0], TransportOptions::default())?;
    t.add_subsystem(nqn, bdev, bdev_name)?;
    Ok(t)
}

impl Drop for LoopbackTarget {
    fn drop(&mut self) {
        self.target.stop();
        if let Some(r) = self.reactors.take() {
            r.shutdown();
        }
    }
}
