//! Fuzz the NVMe/TCP target's PDU decoding as a connection drives it: common headers through
//! `fp_nvme_spec::tcp::check_header` (digests and the data alignment from the first byte), then
//! each accepted PDU's fields (ICReq, CapsuleCmd's SQE, H2CData, a term request), header
//! digests, and a Connect's command and data through `fp_nvme_spec::fabrics::Connect::parse`.
//!
//! Input encoding:
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | setup: `b & 1` header digests, `b & 2` data digests, `b >> 2` the PDA (CPDA) |
//!
//! then PDUs as they would arrive on the socket: 8 bytes of common header, then the rest of
//! the PDU as its PLEN says (an input ending early ends the connection, as EOF would).
//!
//! Checked: no panic; an accepted layout lies inside PLEN (header, data, digest in order, data
//! aligned); a Connect that parses encodes back to the same Connect; a CapsuleCmd re-encoded
//! with the same SQE and data length is accepted with the same layout.
#![no_main]

use fp_nvme_spec::fabrics::{Connect, CONNECT_DATA_LEN};
use fp_nvme_spec::tcp::*;
use fp_nvme_spec::{Sqe, FCTYPE_CONNECT, OPC_FABRICS, SQE_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&setup, mut rest)) = data.split_first() else { return };
    let digests = Digests { header: setup & 1 != 0, data: setup & 2 != 0 };
    let pda = setup >> 2;
    // Far below a real limit, so the fuzzer reaches the limit check.
    let max_plen = 8192 + 4096;
    while rest.len() >= CH_LEN {
        let ch = CommonHeader::parse(rest[..CH_LEN].try_into().unwrap());
        let Ok(l) = check_header(&ch, digests, pda, max_plen) else {
            // The target answers with a term request echoing the header.
            let err = check_header(&ch, digests, pda, max_plen).unwrap_err();
            let mut b = [0u8; DATA_HLEN + TERM_REQ_MAX_DATA];
            let n = write_c2h_term_req(&mut b, &err, &rest[..rest.len().min(MAX_HLEN)]);
            assert!(n >= DATA_HLEN && n <= b.len());
            return;
        };
        assert!(l.header_len <= l.plen());
        if l.data_len > 0 {
            assert!(l.data_offset >= l.header_len);
            let tail = if l.data_digest { DIGEST_LEN } else { 0 };
            assert_eq!(l.data_offset + l.data_len + tail, l.plen());
        }
        if rest.len() < l.plen() {
            return;
        }
        let (pdu, next) = rest.split_at(l.plen());
        rest = next;
        let hlen = usize::from(ch.hlen);
        if l.header_len > hlen && !header_digest_ok(pdu, hlen) {
            return;
        }
        let body = &pdu[l.data_offset..l.data_offset + l.data_len];
        match ch.pdu_type {
            PDU_IC_REQ => {
                let _ = IcReq::parse(pdu[..IC_LEN].try_into().unwrap());
            }
            PDU_CAPSULE_CMD => {
                let sqe = capsule_sqe(pdu).unwrap();
                let mut b = [0u8; HEADER_ROOM];
                let n = write_capsule_cmd(&mut b, &sqe, l.data_len, digests, pda);
                let again = check_header(&CommonHeader::parse(b[..CH_LEN].try_into().unwrap()), digests, pda, u32::MAX)
                    .expect("a capsule we encode is accepted");
                assert_eq!(again.data_len, l.data_len);
                assert_eq!(again.header_len, l.header_len);
                assert!(l.data_len == 0 || again.data_offset == n);
                if sqe.opcode() == OPC_FABRICS && sqe.fctype() == FCTYPE_CONNECT {
                    if let Ok(c) = Connect::parse(&sqe, body) {
                        let mut s = Sqe([0; SQE_LEN]);
                        let mut d = [0u8; CONNECT_DATA_LEN];
                        c.write(&mut s, &mut d);
                        assert_eq!(Connect::parse(&s, &d).unwrap(), c);
                    }
                }
            }
            PDU_H2C_DATA => {
                let _ = DataHeader::parse(pdu).unwrap();
            }
            PDU_H2C_TERM_REQ | PDU_C2H_TERM_REQ => {
                let _ = TermReq::parse(pdu).unwrap();
                return;
            }
            _ => {}
        }
    }
});
