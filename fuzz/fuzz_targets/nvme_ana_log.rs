//! Fuzz the Asymmetric Namespace Access log page parser (`fp_nvme_spec::log_page::AnaLogPage`),
//! which an NVMe host reads from every controller of a multipath subsystem.
//!
//! Input encoding: the whole input is the page as a controller would send it.
//!
//! Checked: no panic and no allocation beyond the input's size; a page that parses encodes into
//! no more bytes than it came in (a count never accepts fewer bytes than it asks for), and
//! those bytes parse back to the same page.
#![no_main]

use fp_nvme_spec::log_page::AnaLogPage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(page) = AnaLogPage::parse(data) {
        let out = page.encode();
        assert_eq!(out.len(), page.len());
        assert!(out.len() <= data.len(), "{page:?} took {} bytes and encodes to {}", data.len(), out.len());
        assert_eq!(AnaLogPage::parse(&out).expect("an encoded page parses"), page);
    }
});
