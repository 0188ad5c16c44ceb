//! The crypto bdev through the shared conformance suite (`fp_bdev::conformance::run_suite`).

use std::sync::Arc;

use fp_bdev::conformance::{run_suite, Storage};
use fp_bdev::{BlockDevice, IoOp, IoStatus, RamDevice};
use fp_crypto::{CryptoDevice, CryptoKey, CryptoLayout};

/// The crypto bdev over RAM disks of both block sizes, with 256- and 512-bit XTS keys. A zeroed
/// base reads back as noise through the cipher (as under dm-crypt), so each disk is zeroed
/// through the crypto bdev first, as the suite wants it. The third disk has a LUKS-style layout:
/// 4096-byte sectors starting 64 KiB into a 512-byte-block base.
#[test]
fn crypto_over_malloc() {
    let k1 = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let k2 = "ffeeddccbbaa99887766554433221100f0e1d2c3b4a5968778695a4b3c2d1e0f";
    for (bs, blocks, hex, layout) in [
        (512, 2048, 32, None),
        (4096, 256, 64, None),
        (512, 2048 + 128, 64, Some(CryptoLayout { data_offset: 64 << 10, sector_size: 4096 })),
    ] {
        let key = Arc::new(CryptoKey::from_hex("k", &k1[..hex], &k2[..hex]).unwrap());
        let make = || -> Arc<dyn BlockDevice> {
            let base = Arc::new(RamDevice::new("malloc0", bs, blocks).unwrap());
            let dev: Arc<dyn BlockDevice> = match layout {
                None => Arc::new(CryptoDevice::new("crypto0", base, key.clone()).unwrap()),
                Some(l) => Arc::new(CryptoDevice::with_layout("crypto0", base, key.clone(), l).unwrap()),
            };
            let mut ch = dev.open_channel().unwrap();
            let size = dev.info().size_bytes();
            let zeroed =
                fp_bdev::conformance::run(&mut *ch, fp_bdev::conformance::cmd(0, IoOp::WriteZeroes, 0, size));
            assert_eq!(zeroed, IoStatus::Success);
            dev
        };
        run_suite(&make, Storage::Keeps);
    }
}
