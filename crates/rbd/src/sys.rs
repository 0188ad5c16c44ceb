//! The librados and librbd functions flashpath calls, loaded at run time.
//!
//! The daemon does not link against Ceph: `librbd.so.1` (Debian package librbd1, which pulls in
//! librados2) is opened the first time an rbd method runs, so hosts without Ceph run flashpath
//! and get a clear error from the rbd methods only (QEMU builds its rbd driver as a loadable
//! module for the same reason). Signatures are those of Ceph 16's `rados/librados.h` and
//! `rbd/librbd.h`; both libraries keep them stable across releases (their sonames are 2 and 1).

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

/// A librados or librbd handle (`rados_t`, `rados_ioctx_t`, `rbd_image_t`): an opaque
/// pointer, passed to C as it is.
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct Handle(*mut c_void);

impl Handle {
    /// No handle yet: what a creating call's out-pointer starts as.
    pub const NULL: Handle = Handle(std::ptr::null_mut());

    /// Whether this is [`Handle::NULL`]: the creating call did not give one.
    pub fn is_null(self) -> bool {
        self.0.is_null()
    }
}

// SAFETY: a handle is an address librados/librbd gave out; what may be done with it from other
// threads is theirs to say, and both say all of it: a rados_t and a rados_ioctx_t are
// thread-safe (librados serialises internally) and an rbd_image_t takes asynchronous I/O from
// any thread (QEMU and SPDK rely on it); flashpath's blocking calls on a handle (open, size,
// resize, close) run on the control plane, one at a time.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

/// `rados_t`: a cluster handle (a librados client).
pub type RadosT = Handle;
/// `rados_ioctx_t`: a pool handle.
pub type IoCtxT = Handle;
/// `rbd_image_t`: an open image.
pub type ImageT = Handle;
/// `rbd_completion_t`: one asynchronous request's completion.
pub type CompletionT = *mut c_void;
/// `rbd_callback_t`: called on a librbd thread when a request completes.
pub type Callback = Fn2<CompletionT, *mut c_void, ()>;

// The C functions of the table by their number of arguments; `R` is the result (`int` unless
// given). Which function has which arguments is each field's type, and its C declaration the
// field's documentation.
pub type Fn1<A, R = c_int> = unsafe extern "C" fn(A) -> R;
pub type Fn2<A, B, R = c_int> = unsafe extern "C" fn(A, B) -> R;
pub type Fn3<A, B, C> = unsafe extern "C" fn(A, B, C) -> c_int;
pub type Fn4<A, B, C, D> = unsafe extern "C" fn(A, B, C, D) -> c_int;
pub type Fn5<A, B, C, D, E> = unsafe extern "C" fn(A, B, C, D, E) -> c_int;
pub type Fn6<A, B, C, D, E, F> = unsafe extern "C" fn(A, B, C, D, E, F) -> c_int;

/// `rbd_aio_readv` and `rbd_aio_writev`: `(image, iov, iovcnt, off, c)`.
pub type AioVectored = Fn5<ImageT, *const libc::iovec, c_int, u64, CompletionT>;
/// `rbd_open` and `rbd_open_read_only`: `(io, name, image, snap_name)`.
pub type Open = Fn4<IoCtxT, *const c_char, *mut ImageT, *const c_char>;

/// The functions, resolved once. Their types are Ceph 16's declarations, which `load`
/// vouches for in one place.
pub struct Lib {
    /// `int rados_create(rados_t *cluster, const char *id)`.
    pub rados_create: Fn2<*mut RadosT, *const c_char>,
    /// `int rados_conf_read_file(rados_t cluster, const char *path)`.
    pub rados_conf_read_file: Fn2<RadosT, *const c_char>,
    /// `int rados_conf_set(rados_t cluster, const char *option, const char *value)`.
    pub rados_conf_set: Fn3<RadosT, *const c_char, *const c_char>,
    /// `int rados_connect(rados_t cluster)`.
    pub rados_connect: Fn1<RadosT>,
    /// `void rados_shutdown(rados_t cluster)`.
    pub rados_shutdown: Fn1<RadosT, ()>,
    /// `int rados_ioctx_create(rados_t cluster, const char *pool_name, rados_ioctx_t *ioctx)`.
    pub rados_ioctx_create: Fn3<RadosT, *const c_char, *mut IoCtxT>,
    /// `void rados_ioctx_destroy(rados_ioctx_t io)`.
    pub rados_ioctx_destroy: Fn1<IoCtxT, ()>,
    /// `int rbd_open(rados_ioctx_t io, const char *name, rbd_image_t *image,
    /// const char *snap_name)`.
    pub rbd_open: Open,
    /// `int rbd_open_read_only(...)`, as `rbd_open`.
    pub rbd_open_read_only: Open,
    /// `int rbd_close(rbd_image_t image)`.
    pub rbd_close: Fn1<ImageT>,
    /// `int rbd_get_size(rbd_image_t image, uint64_t *size)`.
    pub rbd_get_size: Fn2<ImageT, *mut u64>,
    /// `int rbd_resize(rbd_image_t image, uint64_t size)`.
    pub rbd_resize: Fn2<ImageT, u64>,
    /// `int rbd_aio_create_completion(void *cb_arg, rbd_callback_t complete_cb,
    /// rbd_completion_t *c)`.
    pub rbd_aio_create_completion: Fn3<*mut c_void, Callback, *mut CompletionT>,
    /// `ssize_t rbd_aio_get_return_value(rbd_completion_t c)`.
    pub rbd_aio_get_return_value: Fn1<CompletionT, isize>,
    /// `void rbd_aio_release(rbd_completion_t c)`.
    pub rbd_aio_release: Fn1<CompletionT, ()>,
    /// `int rbd_aio_readv(rbd_image_t image, const struct iovec *iov, int iovcnt,
    /// uint64_t off, rbd_completion_t c)`.
    pub rbd_aio_readv: AioVectored,
    /// `int rbd_aio_writev(...)`, as `rbd_aio_readv`.
    pub rbd_aio_writev: AioVectored,
    /// `int rbd_aio_flush(rbd_image_t image, rbd_completion_t c)`.
    pub rbd_aio_flush: Fn2<ImageT, CompletionT>,
    /// `int rbd_aio_discard(rbd_image_t image, uint64_t off, uint64_t len, rbd_completion_t c)`.
    pub rbd_aio_discard: Fn4<ImageT, u64, u64, CompletionT>,
    /// `int rbd_aio_write_zeroes(rbd_image_t image, uint64_t off, size_t len,
    /// rbd_completion_t c, int zero_flags, int op_flags)`.
    pub rbd_aio_write_zeroes: Fn6<ImageT, u64, usize, CompletionT, c_int, c_int>,
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
    // SAFETY: every field's type is the declaration in Ceph 16's rados/librados.h and
    // rbd/librbd.h of the symbol of the same name (each written next to its field); the
    // libraries stay loaded in `_libs` as long as `Lib` lives.
    unsafe {
        Ok(Lib {
            rados_create: symbol(&rados, "rados_create")?,
            rados_conf_read_file: symbol(&rados, "rados_conf_read_file")?,
            rados_conf_set: symbol(&rados, "rados_conf_set")?,
            rados_connect: symbol(&rados, "rados_connect")?,
            rados_shutdown: symbol(&rados, "rados_shutdown")?,
            rados_ioctx_create: symbol(&rados, "rados_ioctx_create")?,
            rados_ioctx_destroy: symbol(&rados, "rados_ioctx_destroy")?,
            rbd_open: symbol(&rbd, "rbd_open")?,
            rbd_open_read_only: symbol(&rbd, "rbd_open_read_only")?,
            rbd_close: symbol(&rbd, "rbd_close")?,
            rbd_get_size: symbol(&rbd, "rbd_get_size")?,
            rbd_resize: symbol(&rbd, "rbd_resize")?,
            rbd_aio_create_completion: symbol(&rbd, "rbd_aio_create_completion")?,
            rbd_aio_get_return_value: symbol(&rbd, "rbd_aio_get_return_value")?,
            rbd_aio_release: symbol(&rbd, "rbd_aio_release")?,
            rbd_aio_readv: symbol(&rbd, "rbd_aio_readv")?,
            rbd_aio_writev: symbol(&rbd, "rbd_aio_writev")?,
            rbd_aio_flush: symbol(&rbd, "rbd_aio_flush")?,
            rbd_aio_discard: symbol(&rbd, "rbd_aio_discard")?,
            rbd_aio_write_zeroes: symbol(&rbd, "rbd_aio_write_zeroes")?,
            _libs: [rbd, rados],
        })
    }
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
