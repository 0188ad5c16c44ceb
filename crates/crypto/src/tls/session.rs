//! A TLS 1.3 session with an external PSK over memory, on OpenSSL's libssl loaded at run time
//! (`libssl.so.3`, as `openssl.rs` loads libcrypto): rustls offers no external PSKs.
//!
//! The session owns no socket. Its caller feeds it the ciphertext it received ([`feed`]),
//! takes the ciphertext it should send ([`take`]), and reads and writes plaintext ([`read`],
//! [`write`]); each call does what it can now and never waits, so a reactor's poller can run it.
//! Between the caller and libssl sits a BIO pair of two fixed buffers ([`BUF`] bytes each way):
//! no allocation per record in steady state (libssl keeps its record buffers), and the memory a
//! peer can make the session hold is bounded. A full buffer shows as a short count: [`feed`]
//! takes fewer bytes, [`write`] writes fewer (0: take ciphertext first).
//!
//! Both sides speak TLS 1.3 only, with the cipher suites of NVMe/TCP (TLS_AES_128_GCM_SHA256,
//! TLS_AES_256_GCM_SHA384), the PSK with (EC)DHE (`psk_dhe_ke`, OpenSSL's default; plain
//! `psk_ke` is not allowed), no certificates, no session tickets, no early data. The client
//! offers one PSK and the suite of its hash; the server finds the PSK of the identity the
//! client names with its caller's lookup (from the ClientHello, before the suite is chosen, so
//! that the suite is the PSK's), and refuses a handshake that did not use a PSK.
//!
//! [`feed`]: TlsSession::feed
//! [`take`]: TlsSession::take
//! [`read`]: TlsSession::read
//! [`write`]: TlsSession::write

use std::ffi::{c_char, c_int, c_long, c_uchar, c_ulong, c_void, CString};
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;

use zeroize::Zeroizing;

use super::psk::PskHash;

/// Bytes of each of the BIO pair's two buffers: two full TLS records (16 KiB of plaintext and
/// up to 256 bytes of overhead each).
pub const BUF: usize = 2 * (16384 + 256);

/// `SSL_CTX *`, `SSL *`, `BIO *`, `SSL_SESSION *`, `const SSL_CIPHER *`, `const SSL_METHOD *`,
/// `const EVP_MD *`: opaque.
type Ctx = *mut c_void;
type Ssl = *mut c_void;
type Bio = *mut c_void;
type Session = *mut c_void;
type Cipher = *const c_void;
type Method = *const c_void;
type Md = *const c_void;

type UseSessionCb = unsafe extern "C" fn(Ssl, Md, *mut *const c_uchar, *mut usize, *mut Session) -> c_int;
type FindSessionCb = unsafe extern "C" fn(Ssl, *const c_uchar, usize, *mut Session) -> c_int;
type ClientHelloCb = unsafe extern "C" fn(Ssl, *mut c_int, *mut c_void) -> c_int;

// OpenSSL 3's constants (ssl.h, tls1.h, bio.h, err.h, sslerr.h).
const TLS1_3_VERSION: c_long = 0x0304;
const SSL_CTRL_MODE: c_int = 33;
const SSL_CTRL_SET_MIN_PROTO_VERSION: c_int = 123;
const SSL_CTRL_SET_MAX_PROTO_VERSION: c_int = 124;
const SSL_MODE_ENABLE_PARTIAL_WRITE: c_long = 1;
const SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER: c_long = 2;
const SSL_OP_NO_TICKET: u64 = 1 << 14;
const SSL_VERIFY_PEER: c_int = 1;
const SSL_ERROR_SSL: c_int = 1;
const SSL_ERROR_WANT_READ: c_int = 2;
const SSL_ERROR_WANT_WRITE: c_int = 3;
const SSL_ERROR_ZERO_RETURN: c_int = 6;
const BIO_CTRL_PENDING: c_int = 10;
const ERR_REASON_MASK: c_ulong = 0x7F_FFFF;
const ERR_SYSTEM_FLAG: c_ulong = 1 << 31;
const SSL_R_BINDER_DOES_NOT_VERIFY: c_ulong = 253;
const SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE: c_ulong = 1040;
const SSL_R_SSLV3_ALERT_ILLEGAL_PARAMETER: c_ulong = 1047;
const SSL_R_TLSV1_ALERT_DECRYPT_ERROR: c_ulong = 1051;
const SSL_R_TLSV1_ALERT_UNKNOWN_PSK_IDENTITY: c_ulong = 1115;
/// TLS 1.3's record overhead with AES-GCM: header, inner content type, tag.
const RECORD_OVERHEAD: usize = 5 + 1 + 16;
/// The most plaintext one record carries.
pub(super) const MAX_FRAGMENT: usize = 16384;

struct Lib {
    tls_method: unsafe extern "C" fn() -> Method,
    ctx_new: unsafe extern "C" fn(Method) -> Ctx,
    ctx_free: unsafe extern "C" fn(Ctx),
    ctx_ctrl: unsafe extern "C" fn(Ctx, c_int, c_long, *mut c_void) -> c_long,
    ctx_set_options: unsafe extern "C" fn(Ctx, u64) -> u64,
    ctx_set_ciphersuites: unsafe extern "C" fn(Ctx, *const c_char) -> c_int,
    ctx_set_num_tickets: unsafe extern "C" fn(Ctx, usize) -> c_int,
    ctx_set_verify: unsafe extern "C" fn(Ctx, c_int, *const c_void),
    ctx_set_client_hello_cb: unsafe extern "C" fn(Ctx, ClientHelloCb, *mut c_void),
    client_hello_get0_ext:
        unsafe extern "C" fn(Ssl, std::ffi::c_uint, *mut *const c_uchar, *mut usize) -> c_int,
    set_ciphersuites: unsafe extern "C" fn(Ssl, *const c_char) -> c_int,
    ssl_new: unsafe extern "C" fn(Ctx) -> Ssl,
    ssl_free: unsafe extern "C" fn(Ssl),
    set_bio: unsafe extern "C" fn(Ssl, Bio, Bio),
    set_connect_state: unsafe extern "C" fn(Ssl),
    set_accept_state: unsafe extern "C" fn(Ssl),
    do_handshake: unsafe extern "C" fn(Ssl) -> c_int,
    read_ex: unsafe extern "C" fn(Ssl, *mut c_void, usize, *mut usize) -> c_int,
    write_ex: unsafe extern "C" fn(Ssl, *const c_void, usize, *mut usize) -> c_int,
    get_error: unsafe extern "C" fn(Ssl, c_int) -> c_int,
    shutdown: unsafe extern "C" fn(Ssl) -> c_int,
    get_shutdown: unsafe extern "C" fn(Ssl) -> c_int,
    set_ex_data: unsafe extern "C" fn(Ssl, c_int, *mut c_void) -> c_int,
    get_ex_data: unsafe extern "C" fn(Ssl, c_int) -> *mut c_void,
    set_psk_use_session_callback: unsafe extern "C" fn(Ssl, UseSessionCb),
    set_psk_find_session_callback: unsafe extern "C" fn(Ssl, FindSessionCb),
    session_new: unsafe extern "C" fn() -> Session,
    session_free: unsafe extern "C" fn(Session),
    session_set1_master_key: unsafe extern "C" fn(Session, *const c_uchar, usize) -> c_int,
    session_set_cipher: unsafe extern "C" fn(Session, Cipher) -> c_int,
    session_set_protocol_version: unsafe extern "C" fn(Session, c_int) -> c_int,
    cipher_find: unsafe extern "C" fn(Ssl, *const c_uchar) -> Cipher,
    session_reused: unsafe extern "C" fn(Ssl) -> c_int,
    get_current_cipher: unsafe extern "C" fn(Ssl) -> Cipher,
    cipher_get_name: unsafe extern "C" fn(Cipher) -> *const c_char,
    // libcrypto's, reached through libssl's handle (dlsym searches its dependencies).
    bio_new_bio_pair: unsafe extern "C" fn(*mut Bio, usize, *mut Bio, usize) -> c_int,
    bio_free: unsafe extern "C" fn(Bio) -> c_int,
    bio_read: unsafe extern "C" fn(Bio, *mut c_void, c_int) -> c_int,
    bio_write: unsafe extern "C" fn(Bio, *const c_void, c_int) -> c_int,
    bio_ctrl: unsafe extern "C" fn(Bio, c_int, c_long, *mut c_void) -> c_long,
    err_get_error: unsafe extern "C" fn() -> c_ulong,
    err_clear_error: unsafe extern "C" fn(),
    err_error_string_n: unsafe extern "C" fn(c_ulong, *mut c_char, usize),
    /// Keeps the library mapped for as long as the pointers above are used: forever.
    _lib: libloading::Library,
}

static LIB: OnceLock<Option<Lib>> = OnceLock::new();

/// The library's soname (OpenSSL 3).
const SONAME: &str = "libssl.so.3";

fn load() -> Option<Lib> {
    // SAFETY: loading libssl runs its and libcrypto's initialisers, which have no
    // preconditions; every symbol is resolved with the signature of OpenSSL 3's headers
    // (ssl.h, bio.h, err.h), which its soname keeps.
    unsafe {
        let lib = libloading::Library::new(SONAME).ok()?;
        Some(Lib {
            tls_method: *lib.get(b"TLS_method\0").ok()?,
            ctx_new: *lib.get(b"SSL_CTX_new\0").ok()?,
            ctx_free: *lib.get(b"SSL_CTX_free\0").ok()?,
            ctx_ctrl: *lib.get(b"SSL_CTX_ctrl\0").ok()?,
            ctx_set_options: *lib.get(b"SSL_CTX_set_options\0").ok()?,
            ctx_set_ciphersuites: *lib.get(b"SSL_CTX_set_ciphersuites\0").ok()?,
            ctx_set_num_tickets: *lib.get(b"SSL_CTX_set_num_tickets\0").ok()?,
            ctx_set_verify: *lib.get(b"SSL_CTX_set_verify\0").ok()?,
            ctx_set_client_hello_cb: *lib.get(b"SSL_CTX_set_client_hello_cb\0").ok()?,
            client_hello_get0_ext: *lib.get(b"SSL_client_hello_get0_ext\0").ok()?,
            set_ciphersuites: *lib.get(b"SSL_set_ciphersuites\0").ok()?,
            ssl_new: *lib.get(b"SSL_new\0").ok()?,
            ssl_free: *lib.get(b"SSL_free\0").ok()?,
            set_bio: *lib.get(b"SSL_set_bio\0").ok()?,
            set_connect_state: *lib.get(b"SSL_set_connect_state\0").ok()?,
            set_accept_state: *lib.get(b"SSL_set_accept_state\0").ok()?,
            do_handshake: *lib.get(b"SSL_do_handshake\0").ok()?,
            read_ex: *lib.get(b"SSL_read_ex\0").ok()?,
            write_ex: *lib.get(b"SSL_write_ex\0").ok()?,
            get_error: *lib.get(b"SSL_get_error\0").ok()?,
            shutdown: *lib.get(b"SSL_shutdown\0").ok()?,
            get_shutdown: *lib.get(b"SSL_get_shutdown\0").ok()?,
            set_ex_data: *lib.get(b"SSL_set_ex_data\0").ok()?,
            get_ex_data: *lib.get(b"SSL_get_ex_data\0").ok()?,
            set_psk_use_session_callback: *lib.get(b"SSL_set_psk_use_session_callback\0").ok()?,
            set_psk_find_session_callback: *lib.get(b"SSL_set_psk_find_session_callback\0").ok()?,
            session_new: *lib.get(b"SSL_SESSION_new\0").ok()?,
            session_free: *lib.get(b"SSL_SESSION_free\0").ok()?,
            session_set1_master_key: *lib.get(b"SSL_SESSION_set1_master_key\0").ok()?,
            session_set_cipher: *lib.get(b"SSL_SESSION_set_cipher\0").ok()?,
            session_set_protocol_version: *lib.get(b"SSL_SESSION_set_protocol_version\0").ok()?,
            cipher_find: *lib.get(b"SSL_CIPHER_find\0").ok()?,
            session_reused: *lib.get(b"SSL_session_reused\0").ok()?,
            get_current_cipher: *lib.get(b"SSL_get_current_cipher\0").ok()?,
            cipher_get_name: *lib.get(b"SSL_CIPHER_get_name\0").ok()?,
            bio_new_bio_pair: *lib.get(b"BIO_new_bio_pair\0").ok()?,
            bio_free: *lib.get(b"BIO_free\0").ok()?,
            bio_read: *lib.get(b"BIO_read\0").ok()?,
            bio_write: *lib.get(b"BIO_write\0").ok()?,
            bio_ctrl: *lib.get(b"BIO_ctrl\0").ok()?,
            err_get_error: *lib.get(b"ERR_get_error\0").ok()?,
            err_clear_error: *lib.get(b"ERR_clear_error\0").ok()?,
            err_error_string_n: *lib.get(b"ERR_error_string_n\0").ok()?,
            _lib: lib,
        })
    }
}

fn lib() -> Option<&'static Lib> {
    LIB.get_or_init(load).as_ref()
}

/// Whether libssl (OpenSSL 3) can be loaded on this host: NVMe/TCP TLS needs it.
pub fn tls_available() -> bool {
    lib().is_some()
}

/// A TLS PSK: the key the handshake uses and the hash of its cipher suite. Cleared on drop.
#[derive(Clone)]
pub struct TlsPsk {
    /// The hash of its cipher suite; the key is as long as its digest.
    pub hash: PskHash,
    /// The key.
    pub key: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for TlsPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPsk").field("hash", &self.hash).finish_non_exhaustive()
    }
}

/// What a server's lookup answers for the identity a client offered: its PSK, or `None`
/// (unknown identity).
pub type PskLookup = Box<dyn FnMut(&[u8]) -> Option<TlsPsk> + Send>;

/// Why a session failed, in a word a caller can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsErrorKind {
    /// The two sides' PSKs differ: the client's binder did not verify (at the server), or the
    /// server said so (at the client: decrypt_error, or illegal_parameter before the handshake
    /// is done, which is what OpenSSL's servers send).
    WrongPsk,
    /// The server has no PSK for the identity offered: its lookup refused it (at the server),
    /// or it refused the handshake (handshake_failure or unknown_psk_identity, at the client).
    UnknownIdentity,
    /// Anything else: a malformed or unexpected message, a refused version or suite, a record
    /// that does not authenticate, a handshake without the PSK, another alert.
    Protocol,
    /// libssl could not be loaded or refused the session's settings.
    Unavailable,
}

/// A session's failure: its kind and OpenSSL's words for it (which never hold key bytes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("TLS {kind:?}: {detail}")]
pub struct TlsError {
    /// What went wrong.
    pub kind: TlsErrorKind,
    /// The details, for the log.
    pub detail: String,
}

impl TlsError {
    fn new(kind: TlsErrorKind, detail: impl Into<String>) -> TlsError {
        TlsError { kind, detail: detail.into() }
    }
}

/// Where a session's handshake is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeState {
    /// Waiting for the peer (feed its ciphertext) or for room to write (take ciphertext).
    InProgress,
    /// Done with the PSK: data flows.
    Established,
}

/// The PSK side of a session, where libssl's callbacks find it (the SSL's ex-data slot 0
/// points here; boxed so that it does not move).
struct PskState {
    lib: &'static Lib,
    /// The client's identity and PSK.
    offer: Option<(Vec<u8>, TlsPsk)>,
    /// The server's lookup.
    lookup: Option<PskLookup>,
    /// What the server's lookup found for an identity of the ClientHello, before the suite was
    /// chosen (so that the suite is the PSK's); the PSK callback takes it from here.
    found: Option<(Vec<u8>, TlsPsk)>,
    /// The identity the server accepted.
    accepted: Option<Vec<u8>>,
    /// Set when the server's lookup refused an identity (or panicked).
    refused: bool,
}

impl PskState {
    /// The server's lookup for `identity`; a panicking lookup (it must not unwind into C)
    /// and an unknown identity answer `None`, and mark the handshake's failure as an unknown
    /// identity.
    fn lookup(&mut self, identity: &[u8]) -> Option<TlsPsk> {
        let lookup = self.lookup.as_mut()?;
        let found = std::panic::catch_unwind(AssertUnwindSafe(|| lookup(identity))).ok().flatten();
        if found.is_none() {
            self.refused = true;
        }
        found
    }
}

/// A TLS 1.3 session, client or server, over memory. Not shared between threads (one caller
/// at a time), but it may move between them.
pub struct TlsSession {
    lib: &'static Lib,
    ctx: Ctx,
    ssl: Ssl,
    /// The network end of the BIO pair (the SSL holds the other).
    net: Bio,
    psk: Box<PskState>,
    established: bool,
    /// The first failure, returned again by every later call.
    failed: Option<TlsError>,
    /// Bytes of the last write libssl asked to repeat (it built their record and wait for room).
    retry_write: usize,
}

// SAFETY: the SSL, its context and BIOs are only reached through `&mut self` (or drop), so one
// thread at a time uses them; OpenSSL objects may move between threads. The lookup is `Send`.
unsafe impl Send for TlsSession {}

impl std::fmt::Debug for TlsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSession")
            .field("established", &self.established)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl TlsSession {
    /// A client that offers `psk` under `identity`.
    pub fn client(identity: &[u8], psk: TlsPsk) -> Result<TlsSession, TlsError> {
        let suites = psk.hash.cipher_suite();
        TlsSession::client_offering(identity, psk, suites)
    }

    /// A client that offers `psk` under `identity` and the cipher suites `suites` (OpenSSL's
    /// names, ':' between), in that order: the tests' stand-in for clients that offer both.
    pub(super) fn client_offering(
        identity: &[u8],
        psk: TlsPsk,
        suites: &str,
    ) -> Result<TlsSession, TlsError> {
        let state = PskState {
            lib: lib().ok_or_else(unavailable)?,
            offer: Some((identity.to_vec(), psk)),
            lookup: None,
            found: None,
            accepted: None,
            refused: false,
        };
        TlsSession::new(state, suites, true)
    }

    /// A server that asks `lookup` for the PSK of the identity a client offers.
    pub fn server(lookup: PskLookup) -> Result<TlsSession, TlsError> {
        let state = PskState {
            lib: lib().ok_or_else(unavailable)?,
            offer: None,
            lookup: Some(lookup),
            found: None,
            accepted: None,
            refused: false,
        };
        TlsSession::new(state, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384", false)
    }

    fn new(state: PskState, suites: &str, client: bool) -> Result<TlsSession, TlsError> {
        let lib = state.lib;
        let refused = |what: &str| TlsError::new(TlsErrorKind::Unavailable, format!("libssl refused {what}"));
        // SAFETY: OpenSSL's functions with their documented arguments; every object created
        // is checked for null and owned by the session from the moment it exists (its drop
        // frees whatever was made).
        unsafe {
            (lib.err_clear_error)();
            let ctx = (lib.ctx_new)((lib.tls_method)());
            if ctx.is_null() {
                return Err(refused("a context"));
            }
            let mut s = TlsSession {
                lib,
                ctx,
                ssl: std::ptr::null_mut(),
                net: std::ptr::null_mut(),
                psk: Box::new(state),
                established: false,
                failed: None,
                retry_write: 0,
            };
            let suites = CString::new(suites).expect("no NUL in suite names");
            let set =
                (lib.ctx_ctrl)(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_3_VERSION, std::ptr::null_mut())
                    == 1
                    && (lib.ctx_ctrl)(
                        ctx,
                        SSL_CTRL_SET_MAX_PROTO_VERSION,
                        TLS1_3_VERSION,
                        std::ptr::null_mut(),
                    ) == 1
                    && (lib.ctx_set_ciphersuites)(ctx, suites.as_ptr()) == 1
                    && (lib.ctx_set_num_tickets)(ctx, 0) == 1;
            if !set {
                return Err(refused("TLS 1.3 with NVMe/TCP's cipher suites"));
            }
            (lib.ctx_set_options)(ctx, SSL_OP_NO_TICKET);
            (lib.ctx_ctrl)(
                ctx,
                SSL_CTRL_MODE,
                SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER,
                std::ptr::null_mut(),
            );
            // A client with nothing to trust: a server that answers with a certificate
            // instead of taking the PSK fails verification.
            if client {
                (lib.ctx_set_verify)(ctx, SSL_VERIFY_PEER, std::ptr::null());
            } else {
                (lib.ctx_set_client_hello_cb)(ctx, client_hello_cb, std::ptr::null_mut());
            }
            s.ssl = (lib.ssl_new)(ctx);
            if s.ssl.is_null() {
                return Err(refused("a session"));
            }
            let mut inner: Bio = std::ptr::null_mut();
            if (lib.bio_new_bio_pair)(&mut inner, BUF, &mut s.net, BUF) != 1 {
                return Err(refused("a BIO pair"));
            }
            // The SSL takes the one reference to its end, for reading and writing.
            (lib.set_bio)(s.ssl, inner, inner);
            let state: *mut PskState = &mut *s.psk;
            if (lib.set_ex_data)(s.ssl, 0, state.cast()) != 1 {
                return Err(refused("the PSK callbacks' data"));
            }
            if client {
                (lib.set_psk_use_session_callback)(s.ssl, use_session_cb);
                (lib.set_connect_state)(s.ssl);
            } else {
                (lib.set_psk_find_session_callback)(s.ssl, find_session_cb);
                (lib.set_accept_state)(s.ssl);
            }
            Ok(s)
        }
    }

    /// Hands the session ciphertext received from the peer; returns how many bytes it took
    /// (fewer when its buffer is full: read plaintext, then feed the rest). Moves the
    /// handshake on.
    pub fn feed(&mut self, ciphertext: &[u8]) -> Result<usize, TlsError> {
        self.check()?;
        let mut taken = 0;
        while taken < ciphertext.len() {
            let chunk = (ciphertext.len() - taken).min(c_int::MAX as usize) as c_int;
            // SAFETY: our end of the pair; `chunk` readable bytes from `ciphertext[taken..]`.
            let n = unsafe { (self.lib.bio_write)(self.net, ciphertext[taken..].as_ptr().cast(), chunk) };
            if n <= 0 {
                break;
            }
            taken += n as usize;
        }
        if !self.established {
            self.handshake()?;
        }
        Ok(taken)
    }

    /// Takes ciphertext the session has for the peer into `out`; returns how many bytes (0:
    /// none now).
    pub fn take(&mut self, out: &mut [u8]) -> usize {
        let len = out.len().min(c_int::MAX as usize) as c_int;
        if len == 0 {
            return 0;
        }
        // SAFETY: our end of the pair; `out` is writable for `len` bytes.
        let n = unsafe { (self.lib.bio_read)(self.net, out.as_mut_ptr().cast(), len) };
        n.max(0) as usize
    }

    /// Bytes of ciphertext waiting to be taken.
    pub fn pending(&self) -> usize {
        // SAFETY: our end of the pair; BIO_CTRL_PENDING takes no argument.
        let n = unsafe { (self.lib.bio_ctrl)(self.net, BIO_CTRL_PENDING, 0, std::ptr::null_mut()) };
        n.max(0) as usize
    }

    /// Moves the handshake on as far as the ciphertext fed allows.
    pub fn handshake(&mut self) -> Result<HandshakeState, TlsError> {
        self.check()?;
        if self.established {
            return Ok(HandshakeState::Established);
        }
        // SAFETY: our SSL, its BIO and callbacks set.
        let (r, err) = unsafe {
            (self.lib.err_clear_error)();
            let r = (self.lib.do_handshake)(self.ssl);
            (r, (self.lib.get_error)(self.ssl, r))
        };
        if r == 1 {
            // SAFETY: our SSL, its handshake finished.
            let with_psk = unsafe { (self.lib.session_reused)(self.ssl) } == 1;
            if !with_psk {
                return Err(
                    self.fail(TlsError::new(TlsErrorKind::Protocol, "the handshake did not use the PSK"))
                );
            }
            self.established = true;
            return Ok(HandshakeState::Established);
        }
        match err {
            SSL_ERROR_WANT_READ | SSL_ERROR_WANT_WRITE => Ok(HandshakeState::InProgress),
            _ => Err(self.failure(err)),
        }
    }

    /// Whether the handshake is done.
    pub fn is_established(&self) -> bool {
        self.established
    }

    /// Reads plaintext the peer sent into `buf`; returns how many bytes (0: none yet, or the
    /// peer closed: see [`TlsSession::peer_closed`]).
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, TlsError> {
        self.check()?;
        if !self.established && self.handshake()? == HandshakeState::InProgress {
            return Ok(0);
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let mut n = 0usize;
        // SAFETY: our established SSL; `buf` is writable for its length.
        let (r, err) = unsafe {
            (self.lib.err_clear_error)();
            let r = (self.lib.read_ex)(self.ssl, buf.as_mut_ptr().cast(), buf.len(), &mut n);
            (r, (self.lib.get_error)(self.ssl, r))
        };
        if r == 1 {
            return Ok(n);
        }
        match err {
            SSL_ERROR_WANT_READ | SSL_ERROR_WANT_WRITE | SSL_ERROR_ZERO_RETURN => Ok(0),
            _ => Err(self.failure(err)),
        }
    }

    /// Encrypts plaintext for the peer (take the ciphertext with [`TlsSession::take`]);
    /// returns how many bytes of `data` it took: fewer when the outgoing buffer fills, 0 when
    /// it is full or the handshake is not done. After a 0 that followed a partly built record,
    /// the next call must start with the same bytes.
    pub fn write(&mut self, data: &[u8]) -> Result<usize, TlsError> {
        self.check()?;
        if !self.established && self.handshake()? == HandshakeState::InProgress {
            return Ok(0);
        }
        let mut done = 0;
        while done < data.len() {
            // Whole records into the room there is, so that libssl never waits for room with
            // a record half written (it would then want the same bytes again).
            let len = if self.retry_write > 0 {
                assert!(data.len() - done >= self.retry_write, "a TLS write retried with fewer bytes");
                self.retry_write
            } else {
                let room = self.room();
                if room <= RECORD_OVERHEAD {
                    break;
                }
                (data.len() - done).min(MAX_FRAGMENT).min(room - RECORD_OVERHEAD)
            };
            let mut n = 0usize;
            // SAFETY: our established SSL; `len` readable bytes from `data[done..]`.
            let (r, err) = unsafe {
                (self.lib.err_clear_error)();
                let r = (self.lib.write_ex)(self.ssl, data[done..].as_ptr().cast(), len, &mut n);
                (r, (self.lib.get_error)(self.ssl, r))
            };
            if r == 1 {
                self.retry_write = 0;
                done += n;
                continue;
            }
            match err {
                SSL_ERROR_WANT_WRITE | SSL_ERROR_WANT_READ => {
                    self.retry_write = len;
                    break;
                }
                _ => return Err(self.failure(err)),
            }
        }
        Ok(done)
    }

    /// Sends close_notify (take it with [`TlsSession::take`]).
    pub fn close(&mut self) {
        if self.failed.is_none() {
            // SAFETY: our SSL; a shutdown before the handshake is done only fails.
            unsafe {
                (self.lib.err_clear_error)();
                (self.lib.shutdown)(self.ssl);
                (self.lib.err_clear_error)();
            }
        }
    }

    /// Whether the peer sent close_notify.
    pub fn peer_closed(&self) -> bool {
        const SSL_RECEIVED_SHUTDOWN: c_int = 2;
        // SAFETY: our SSL; SSL_get_shutdown only reads its flags.
        unsafe { (self.lib.get_shutdown)(self.ssl) & SSL_RECEIVED_SHUTDOWN != 0 }
    }

    /// The identity the server accepted (the server side, once it has).
    pub fn accepted_identity(&self) -> Option<&[u8]> {
        self.psk.accepted.as_deref()
    }

    /// The negotiated cipher suite (OpenSSL's name), once established.
    pub fn cipher_suite(&self) -> Option<String> {
        // SAFETY: our SSL; the cipher and its name are libssl's static data or null.
        unsafe {
            let c = (self.lib.get_current_cipher)(self.ssl);
            if c.is_null() {
                return None;
            }
            let name = (self.lib.cipher_get_name)(c);
            (!name.is_null()).then(|| std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned())
        }
    }

    /// The sticky failure, if any.
    fn check(&self) -> Result<(), TlsError> {
        self.failed.clone().map_or(Ok(()), Err)
    }

    fn fail(&mut self, e: TlsError) -> TlsError {
        self.failed = Some(e.clone());
        e
    }

    /// Room in the outgoing buffer: what the SSL's end may write before the caller takes.
    fn room(&self) -> usize {
        BUF.saturating_sub(self.pending())
    }

    /// The error of a call that failed with `SSL_get_error` = `err`, drained from OpenSSL's
    /// queue and classified; it sticks.
    fn failure(&mut self, err: c_int) -> TlsError {
        let mut detail = Vec::new();
        let mut kind = TlsErrorKind::Protocol;
        // RFC 8446 has a server answer a binder that does not verify with decrypt_error;
        // OpenSSL's servers send illegal_parameter. A client that offered its PSK and hears
        // either before the handshake is done was told its PSK is not the server's.
        let offered = self.psk.offer.is_some() && !self.established;
        loop {
            // SAFETY: OpenSSL's thread-local error queue.
            let e = unsafe { (self.lib.err_get_error)() };
            if e == 0 {
                break;
            }
            let reason = if e & ERR_SYSTEM_FLAG != 0 { 0 } else { e & ERR_REASON_MASK };
            kind = match reason {
                SSL_R_BINDER_DOES_NOT_VERIFY | SSL_R_TLSV1_ALERT_DECRYPT_ERROR => TlsErrorKind::WrongPsk,
                SSL_R_SSLV3_ALERT_ILLEGAL_PARAMETER if offered => TlsErrorKind::WrongPsk,
                SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE | SSL_R_TLSV1_ALERT_UNKNOWN_PSK_IDENTITY
                    if kind == TlsErrorKind::Protocol =>
                {
                    TlsErrorKind::UnknownIdentity
                }
                _ => kind,
            };
            let mut text = [0 as c_char; 256];
            // SAFETY: a 256-byte buffer, which ERR_error_string_n fills NUL-terminated.
            let s = unsafe {
                (self.lib.err_error_string_n)(e, text.as_mut_ptr(), text.len());
                std::ffi::CStr::from_ptr(text.as_ptr()).to_string_lossy().into_owned()
            };
            detail.push(s);
        }
        // An identity found but not used (its hash is not the suite's) was not accepted.
        self.psk.accepted = None;
        if self.psk.refused {
            kind = TlsErrorKind::UnknownIdentity;
            detail.insert(0, "no PSK for the identity offered".into());
        }
        if detail.is_empty() {
            detail.push(format!(
                "SSL_get_error {err}{}",
                if err == SSL_ERROR_SSL { "" } else { " (no detail)" }
            ));
        }
        self.fail(TlsError::new(kind, detail.join("; ")))
    }
}

impl Drop for TlsSession {
    fn drop(&mut self) {
        // SAFETY: ours, each freed once and not used after; SSL_free frees the SSL's end of
        // the pair and the session it holds; the PSK state outlives the SSL (dropped after).
        unsafe {
            if !self.ssl.is_null() {
                (self.lib.ssl_free)(self.ssl);
            }
            if !self.net.is_null() {
                (self.lib.bio_free)(self.net);
            }
            (self.lib.ctx_free)(self.ctx);
        }
    }
}

fn unavailable() -> TlsError {
    TlsError::new(TlsErrorKind::Unavailable, format!("{SONAME} (OpenSSL 3) could not be loaded"))
}

/// The two bytes of the TLS 1.3 suite of `hash` (RFC 8446 B.4).
fn suite_id(hash: PskHash) -> [u8; 2] {
    match hash {
        PskHash::Sha256 => [0x13, 0x01],
        PskHash::Sha384 => [0x13, 0x02],
    }
}

/// An SSL_SESSION holding `psk` for TLS 1.3 with its hash's suite; null if libssl refuses.
///
/// # Safety
/// `ssl` is a live SSL of `lib`.
unsafe fn psk_session(lib: &Lib, ssl: Ssl, psk: &TlsPsk) -> Session {
    let id = suite_id(psk.hash);
    // SAFETY: the caller's SSL; `id` is the two bytes SSL_CIPHER_find reads; the session is
    // freed here if any step fails, else handed to OpenSSL, which takes ownership.
    unsafe {
        let cipher = (lib.cipher_find)(ssl, id.as_ptr());
        let sess = (lib.session_new)();
        if cipher.is_null() || sess.is_null() {
            if !sess.is_null() {
                (lib.session_free)(sess);
            }
            return std::ptr::null_mut();
        }
        let ok = (lib.session_set1_master_key)(sess, psk.key.as_ptr(), psk.key.len()) == 1
            && (lib.session_set_cipher)(sess, cipher) == 1
            && (lib.session_set_protocol_version)(sess, TLS1_3_VERSION as c_int) == 1;
        if !ok {
            (lib.session_free)(sess);
            return std::ptr::null_mut();
        }
        sess
    }
}

/// The PSK state behind `ssl`'s ex-data slot 0.
///
/// # Safety
/// `ssl` is a session's SSL, whose slot 0 points at its boxed `PskState`, alive while the SSL
/// is; libssl calls back only from within a call the session makes through `&mut self`.
unsafe fn state<'a>(ssl: Ssl) -> Option<&'a mut PskState> {
    let lib = lib()?;
    // SAFETY: per the function's contract.
    unsafe { (lib.get_ex_data)(ssl, 0).cast::<PskState>().as_mut() }
}

/// The client's PSK callback: offers its identity and a session with its PSK. Called with
/// `md` null first, and again with the hash of the suite the server picked after a
/// HelloRetryRequest; a PSK of another hash is then withheld.
unsafe extern "C" fn use_session_cb(
    ssl: Ssl,
    md: Md,
    id: *mut *const c_uchar,
    idlen: *mut usize,
    sess: *mut Session,
) -> c_int {
    // SAFETY: libssl's callback contract: `ssl` is the session's, the out-pointers writable.
    unsafe {
        *sess = std::ptr::null_mut();
        let Some(state) = state(ssl) else { return 0 };
        let Some((identity, psk)) = &state.offer else { return 0 };
        let made = psk_session(state.lib, ssl, psk);
        if made.is_null() {
            return 0;
        }
        // A second call names the server's hash; ours is the only suite offered, so it is
        // ours. (Checked by the handshake: a session of another hash would not be used.)
        let _ = md;
        *id = identity.as_ptr();
        *idlen = identity.len();
        *sess = made;
        1
    }
}

/// The server's PSK callback: asks the lookup for the identity's PSK. An unknown identity
/// gets no session (the handshake then fails, with no certificate to fall back on).
unsafe extern "C" fn find_session_cb(
    ssl: Ssl,
    identity: *const c_uchar,
    len: usize,
    sess: *mut Session,
) -> c_int {
    // SAFETY: libssl's callback contract: `identity` holds `len` readable bytes, `sess` is
    // writable, `ssl` is the session's.
    unsafe {
        *sess = std::ptr::null_mut();
        let Some(state) = state(ssl) else { return 0 };
        let id = if len == 0 { &[][..] } else { std::slice::from_raw_parts(identity, len) };
        let found = if state.found.as_ref().is_some_and(|(known, _)| known == id) {
            state.found.take().map(|(_, psk)| psk)
        } else {
            state.lookup(id)
        };
        if let Some(psk) = found {
            let made = psk_session(state.lib, ssl, &psk);
            if made.is_null() {
                return 0;
            }
            state.accepted = Some(id.to_vec());
            *sess = made;
        }
        1
    }
}

/// The identities of a ClientHello's pre_shared_key extension (RFC 8446 §4.2.11:
/// `identities<7..2^16-1>` of `identity<1..2^16-1>` and a 4-byte ticket age, then binders), in
/// order; stops at the first malformed one (libssl refuses the ClientHello then anyway).
pub(super) fn offered_identities(ext: &[u8]) -> impl Iterator<Item = &[u8]> {
    let list = ext
        .get(..2)
        .map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])))
        .and_then(|len| ext.get(2..2 + len))
        .unwrap_or(&[]);
    let mut rest = list;
    std::iter::from_fn(move || {
        let len = usize::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?));
        let identity = rest.get(2..2 + len)?;
        rest = rest.get(2 + len + 4..)?;
        Some(identity)
    })
}

/// The server's ClientHello callback: before libssl chooses the suite, finds the PSK of the
/// first identity the lookup knows and keeps only its hash's suite. Without it libssl would
/// pick by the client's order of suites and then drop a PSK of the other hash (a SHA-384 PSK
/// from a client that lists TLS_AES_128_GCM_SHA256 first).
unsafe extern "C" fn client_hello_cb(ssl: Ssl, _alert: *mut c_int, _arg: *mut c_void) -> c_int {
    const PRE_SHARED_KEY: std::ffi::c_uint = 41;
    const SSL_CLIENT_HELLO_SUCCESS: c_int = 1;
    // SAFETY: libssl's callback contract: `ssl` is the session's, inside its handshake; the
    // extension's bytes stay valid for the callback; the suite name is NUL-terminated.
    unsafe {
        let Some(state) = state(ssl) else { return SSL_CLIENT_HELLO_SUCCESS };
        let (mut ext, mut len): (*const c_uchar, usize) = (std::ptr::null(), 0);
        if (state.lib.client_hello_get0_ext)(ssl, PRE_SHARED_KEY, &mut ext, &mut len) != 1 || ext.is_null() {
            return SSL_CLIENT_HELLO_SUCCESS;
        }
        let ext = std::slice::from_raw_parts(ext, len);
        for identity in offered_identities(ext) {
            if let Some(psk) = state.lookup(identity) {
                let suite = CString::new(psk.hash.cipher_suite()).expect("no NUL in suite names");
                (state.lib.set_ciphersuites)(ssl, suite.as_ptr());
                state.refused = false;
                state.found = Some((identity.to_vec(), psk));
                break;
            }
        }
        SSL_CLIENT_HELLO_SUCCESS
    }
}
