//! AES-XTS from OpenSSL's libcrypto, loaded at run time: the crypto bdev's cipher when the host
//! has `libcrypto.so.3` (Debian package libssl3).
//!
//! OpenSSL's XTS keeps many blocks in flight with AES-NI and, on CPUs that have them, the VAES
//! vector instructions, which the `aes` crate does not use: about three times the speed of the
//! batched mode in `xts.rs` on this project's machine (docs/crypto.md#performance). The library
//! is opened, not linked, so building flashpath needs no C library or pkg-config, and a host
//! without it falls back to `xts.rs`. The EVP calls used are OpenSSL 3's stable API: a context
//! per direction and channel is given the key once; each data unit then sets its IV (the tweak)
//! and runs one `EVP_CipherUpdate`, which for XTS is one whole data unit. Freeing a context
//! clears its key schedule (OpenSSL cleanses cipher data on reset).

use std::ffi::{c_int, c_uchar, c_void};
use std::sync::OnceLock;

/// `EVP_CIPHER_CTX *` and `const EVP_CIPHER *`, opaque.
type Ctx = *mut c_void;
type Cipher = *const c_void;

struct Lib {
    ctx_new: unsafe extern "C" fn() -> Ctx,
    ctx_free: unsafe extern "C" fn(Ctx),
    aes_128_xts: unsafe extern "C" fn() -> Cipher,
    aes_256_xts: unsafe extern "C" fn() -> Cipher,
    cipher_init:
        unsafe extern "C" fn(Ctx, Cipher, *const c_void, *const c_uchar, *const c_uchar, c_int) -> c_int,
    cipher_update: unsafe extern "C" fn(Ctx, *mut c_uchar, *mut c_int, *const c_uchar, c_int) -> c_int,
    /// Keeps the library mapped for as long as the pointers above are used: forever.
    _lib: libloading::Library,
}

static LIB: OnceLock<Option<Lib>> = OnceLock::new();

/// The library's soname (OpenSSL 3).
const SONAME: &str = "libcrypto.so.3";

fn load() -> Option<Lib> {
    // SAFETY: loading libcrypto runs its initialisers, which have no preconditions; the symbols
    // are resolved with the signatures of OpenSSL 3's `openssl/evp.h`, which its soname keeps.
    unsafe {
        let lib = libloading::Library::new(SONAME).ok()?;
        Some(Lib {
            ctx_new: *lib.get(b"EVP_CIPHER_CTX_new\0").ok()?,
            ctx_free: *lib.get(b"EVP_CIPHER_CTX_free\0").ok()?,
            aes_128_xts: *lib.get(b"EVP_aes_128_xts\0").ok()?,
            aes_256_xts: *lib.get(b"EVP_aes_256_xts\0").ok()?,
            cipher_init: *lib.get(b"EVP_CipherInit_ex\0").ok()?,
            cipher_update: *lib.get(b"EVP_CipherUpdate\0").ok()?,
            _lib: lib,
        })
    }
}

fn lib() -> Option<&'static Lib> {
    LIB.get_or_init(load).as_ref()
}

/// Whether OpenSSL's XTS can be used on this host.
pub fn available() -> bool {
    lib().is_some()
}

/// One direction of one XTS key in OpenSSL: owned by one channel (a context is not shared
/// between threads), freed, key schedule and all, on drop.
pub struct EvpXts {
    lib: &'static Lib,
    ctx: Ctx,
}

// SAFETY: the context is only reached through `&mut self` (or drop), so one thread at a time
// uses it; OpenSSL contexts may move between threads.
unsafe impl Send for EvpXts {}

impl EvpXts {
    /// A context for `key` (both XTS halves, 32 or 64 bytes), encrypting or decrypting; `None`
    /// when libcrypto is missing or refuses the key.
    pub fn new(key: &[u8], encrypt: bool) -> Option<EvpXts> {
        let lib = lib()?;
        // SAFETY: the functions are OpenSSL's, called with their documented arguments.
        let cipher = unsafe {
            match key.len() {
                32 => (lib.aes_128_xts)(),
                64 => (lib.aes_256_xts)(),
                _ => return None,
            }
        };
        // SAFETY: as above; a null context is checked.
        let ctx = unsafe { (lib.ctx_new)() };
        if ctx.is_null() || cipher.is_null() {
            return None;
        }
        let x = EvpXts { lib, ctx };
        // SAFETY: `ctx` is a fresh context, `key` holds the cipher's key length (checked
        // above), no IV yet (each unit sets its own).
        let ok = unsafe {
            (lib.cipher_init)(
                ctx,
                cipher,
                std::ptr::null(),
                key.as_ptr(),
                std::ptr::null(),
                c_int::from(encrypt),
            )
        };
        (ok == 1).then_some(x)
    }

    /// Runs the unit in `dst` in place (whole 16-byte blocks, at most 16 MiB) with the tweak of
    /// 512-byte sector `sector`.
    pub fn run_in_place(&mut self, dst: &mut [u8], sector: u64) {
        self.run(None, dst, sector)
    }

    /// Runs the unit `src` into `dst` (the same length) with the tweak of 512-byte sector
    /// `sector`, leaving `src` alone.
    pub fn run_to(&mut self, src: &[u8], dst: &mut [u8], sector: u64) {
        assert_eq!(src.len(), dst.len(), "source and destination differ in length");
        self.run(Some(src), dst, sector)
    }

    /// `src` (`None`: `dst` itself) into `dst`.
    fn run(&mut self, src: Option<&[u8]>, dst: &mut [u8], sector: u64) {
        let len = dst.len();
        assert!(len.is_multiple_of(16) && len <= 16 << 20, "a {len}-byte XTS unit");
        let src_ptr = src.map_or(dst.as_ptr(), <[u8]>::as_ptr);
        let iv = u128::from(sector).to_le_bytes();
        let mut out_len: c_int = 0;
        // SAFETY: our context, initialised with a key; a 16-byte IV; `-1` keeps the direction.
        // `dst` is writable for `len` bytes and the source readable for as many (checked by
        // `run_to`); it is `dst` itself or a distinct borrow, so the two never partly overlap,
        // and OpenSSL allows them to be the same.
        let ok = unsafe {
            (self.lib.cipher_init)(
                self.ctx,
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                iv.as_ptr(),
                -1,
            ) == 1
                && (self.lib.cipher_update)(self.ctx, dst.as_mut_ptr(), &mut out_len, src_ptr, len as c_int)
                    == 1
        };
        // Cannot fail for a whole number of blocks with a key set; if it ever did, leaving the
        // data as it was would write plaintext to the base.
        assert!(ok && out_len as usize == len, "OpenSSL's AES-XTS failed on a {len}-byte unit");
    }
}

impl Drop for EvpXts {
    fn drop(&mut self) {
        // SAFETY: our context, not used after this.
        unsafe { (self.lib.ctx_free)(self.ctx) };
    }
}
