//! The librados and librbd functions flashpath calls, loaded at run time.
//!
//! The daemon does not link against Ceph: `librbd.so.1` (Debian package librbd1, which pulls in
//! librados2) is opened the first time an rbd method runs, so hosts without Ceph run flashpath
//! and get a clear error from the rbd methods only (QEMU builds its rbd driver as a loadable
//! module for the same reason). Signatures are those of Ceph 16's `rados/librados.h` and
//! `rbd/librbd.h`; both libraries keep them stable across releases (their sonames are 2 and 1).

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

/// `rados_t`: a cluster handle (a librados client).
pub type RadosT = *mut c_void;
/// `rados_ioctx_t`: a pool handle.
pub type IoCtxT = *mut c_void;
/// `rbd_image_t`: an open image.
pub type ImageT = *mut c_void;
/// `rbd_completion_t`: one asynchronous request's completion.
pub type CompletionT = *mut c_void;
/// `rbd_callback_t`: called on a librbd thread when a request completes.
pub type Callback = unsafe extern "C" fn(c: CompletionT, arg: *mut c_void);

/// The functions, resolved once.
pub struct Lib {
    pub rados_create: unsafe extern "C" fn(cluster: *mut RadosT, id: *const c_char) -> c_int,
    pub rados_conf_read_file: unsafe extern "C" fn(cluster: RadosT, path: *const c_char) -> c_int,
    pub rados_conf_set:
        unsafe extern "C" fn(cluster: RadosT, option: *const c_char, value: *const c_char) -> c_int,
    pub rados_connect: unsafe extern "C" fn(cluster: RadosT) -> c_int,
    pub rados_shutdown: unsafe extern "C" fn(cluster: RadosT),
    pub rados_ioctx_create:
        unsafe extern "C" fn(cluster: RadosT, pool: *const c_char, ioctx: *mut IoCtxT) -> c_int,
    pub rados_ioctx_destroy: unsafe extern "C" fn(ioctx: IoCtxT),
    pub rbd_open: unsafe extern "C" fn(
        io: IoCtxT,
        name: *const c_char,
        image: *mut ImageT,
        snap_name: *const c_char,
    ) -> c_int,
    pub rbd_open_read_only: unsafe extern "C" fn(
        io: IoCtxT,
        name: *const c_char,
        image: *mut ImageT,
        snap_name: *const c_char,
    ) -> c_int,
    pub rbd_close: unsafe extern "C" fn(image: ImageT) -> c_int,
    pub rbd_get_size: unsafe extern "C" fn(image: ImageT, size: *mut u64) -> c_int,
    pub rbd_resize: unsafe extern "C" fn(image: ImageT, size: u64) -> c_int,
    pub rbd_aio_create_completion:
        unsafe extern "C" fn(cb_arg: *mut c_void, cb: Callback, c: *mut CompletionT) -> c_int,
    pub rbd_aio_get_return_value: unsafe extern "C" fn(c: CompletionT) -> isize,
    pub rbd_aio_release: unsafe extern "C" fn(c: CompletionT),
    pub rbd_aio_readv: unsafe extern "C" fn(
        image: ImageT,
        iov: *const libc::iovec,
        iovcnt: c_int,
        off: u64,
        c: CompletionT,
    ) -> c_int,
    pub rbd_aio_writev: unsafe extern "C" fn(
        image: ImageT,
        iov: *const libc::iovec,
        iovcnt: c_int,
        off: u64,
        c: CompletionT,
    ) -> c_int,
    pub rbd_aio_flush: unsafe extern "C" fn(image: ImageT, c: CompletionT) -> c_int,
    pub rbd_aio_discard: unsafe extern "C" fn(image: ImageT, off: u64, len: u64, c: CompletionT) -> c_int,
    pub rbd_aio_write_zeroes: unsafe extern "C" fn(
        image: ImageT,
        off: u64,
        len: usize,
        c: CompletionT,
        zero_flags: c_int,
        op_flags: c_int,
    ) -> c_int,
    /// Keeps the libraries mapped for as long as the pointers above are used: forever.
    _libs: [libloading::Library; 2],
}

/// The library name a user installs, for error messages.
pub const PACKAGE_HINT: &str = "librbd is not installed (Debian package librbd1)";

static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

/// The loaded functions, or why they cannot be loaded (the same answer every time).
pub fn lib() -> Result<&'static Lib, &'static str> {
    LIB.get_or_init(|| load("librbd.so.1", "librados.so.2")).as_ref().map_err(String::as_str)
}

fn load(rbd: &str, rados: &str) -> Result<Lib, String> {
    // SAFETY: loading librbd and librados runs their static initialisers, which only set up
    // their own state (no code of ours runs, nothing of ours is replaced).
    let (rbd, rados) = unsafe {
        let rbd = libloading::Library::new(rbd).map_err(|e| format!("{PACKAGE_HINT}: {e}"))?;
        let rados = libloading::Library::new(rados).map_err(|e| format!("{PACKAGE_HINT}: {e}"))?;
        (rbd, rados)
    };
    macro_rules! sym {
        ($lib:expr, $name:ident) => {
            // SAFETY: the symbol's type is the one declared in the field of the same name,
            // after Ceph's header; the library stays loaded in `_libs` as long as `Lib` lives.
            unsafe { symbol(&$lib, stringify!($name)) }?
        };
    }
    Ok(Lib {
        rados_create: sym!(rados, rados_create),
        rados_conf_read_file: sym!(rados, rados_conf_read_file),
        rados_conf_set: sym!(rados, rados_conf_set),
        rados_connect: sym!(rados, rados_connect),
        rados_shutdown: sym!(rados, rados_shutdown),
        rados_ioctx_create: sym!(rados, rados_ioctx_create),
        rados_ioctx_destroy: sym!(rados, rados_ioctx_destroy),
        rbd_open: sym!(rbd, rbd_open),
        rbd_open_read_only: sym!(rbd, rbd_open_read_only),
        rbd_close: sym!(rbd, rbd_close),
        rbd_get_size: sym!(rbd, rbd_get_size),
        rbd_resize: sym!(rbd, rbd_resize),
        rbd_aio_create_completion: sym!(rbd, rbd_aio_create_completion),
        rbd_aio_get_return_value: sym!(rbd, rbd_aio_get_return_value),
        rbd_aio_release: sym!(rbd, rbd_aio_release),
        rbd_aio_readv: sym!(rbd, rbd_aio_readv),
        rbd_aio_writev: sym!(rbd, rbd_aio_writev),
        rbd_aio_flush: sym!(rbd, rbd_aio_flush),
        rbd_aio_discard: sym!(rbd, rbd_aio_discard),
        rbd_aio_write_zeroes: sym!(rbd, rbd_aio_write_zeroes),
        _libs: [rbd, rados],
    })
}

/// The function `name` of `lib`, as a `T`.
///
/// # Safety
/// `T` must be the function's type, and `lib` stay loaded while the result is used.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, String> {
    let cname = format!("{name}\0");
    // SAFETY: as the caller promises.
    let sym = unsafe { lib.get::<T>(cname.as_bytes()) };
    sym.map(|s| *s).map_err(|e| format!("{PACKAGE_HINT} (it lacks {name}: {e})"))
}

/// A negative errno from librados/librbd as text ("Connection timed out (os error 110)").
pub fn errno_text(ret: i64) -> String {
    std::io::Error::from_raw_os_error(ret.unsigned_abs().min(i32::MAX as u64) as i32).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_library_is_an_error_naming_the_package() {
        let e = super::load("librbd-not-here.so.1", "librados.so.2").err().expect("no such library");
        assert!(e.starts_with("librbd is not installed (Debian package librbd1): "), "{e}");
        assert!(e.contains("librbd-not-here.so.1"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }

    #[test]
    fn a_library_without_the_functions_is_an_error_naming_the_first_missing_one() {
        // libc loads, but has no rados_create.
        let e = super::load("libc.so.6", "libc.so.6").err().expect("libc is not librbd");
        assert!(e.contains("it lacks rados_create"), "{e}");
    }
}
