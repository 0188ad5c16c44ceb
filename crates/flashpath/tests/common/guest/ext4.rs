//! The host's view of an ext4 file system a guest made: e2fsprogs' tools on an image file
//! (a backing file, or a disk read back into one), shared by the guest tests that check files.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A host tool from e2fsprogs (in /usr/sbin or /sbin, which may not be on the PATH).
pub fn e2fs_tool(name: &str) -> PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} not found: install e2fsprogs (./run test does)"))
}

/// debugfs -R REQUEST on an ext4 image: its standard output.
pub fn debugfs(img: &Path, request: &str) -> Vec<u8> {
    let out =
        Command::new(e2fs_tool("debugfs")).arg("-R").arg(request).arg(img).output().expect("running debugfs");
    assert!(out.status.success(), "debugfs {request}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// debugfs -R "cat PATH" on an ext4 image.
pub fn debugfs_cat(img: &Path, path: &str) -> Vec<u8> {
    debugfs(img, &format!("cat {path}"))
}

/// `e2fsck -fn` on an image finds nothing.
pub fn assert_e2fsck_clean(what: &str, img: &Path) {
    let fsck = Command::new(e2fs_tool("e2fsck")).arg("-fn").arg(img).output().expect("running e2fsck");
    assert!(
        fsck.status.success(),
        "{what}: e2fsck -fn found problems ({}):\n{}{}",
        fsck.status,
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
}
