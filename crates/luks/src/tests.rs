//! Unit tests: the AF splitter, the header checks and bounds, the two LUKS2 copies (every
//! flipped byte, the seqid rule) and the crash-safety of key slot changes. The tests against
//! cryptsetup and QEMU are in tests/tools.rs.

use super::*;
use crate::af::{self, STRIPES};
use crate::crypto::Hash;
use crate::volume::*;
use serde_json::Value;

const PASS: &[u8] = b"unit pass";

fn pbkdf2() -> Kdf {
    Kdf::Pbkdf2 { hash: "sha256".into(), iterations: 1000 }
}

fn opts(version: Version) -> FormatOptions {
    FormatOptions {
        version,
        cipher: "aes-xts-plain64".into(),
        key_bits: 256,
        sector_size: 512,
        kdf: pbkdf2(),
        label: (version == Version::Luks2).then(|| "unit".to_owned()),
        uuid: None,
    }
}

/// A formatted volume in memory: just past the data offset.
fn volume(version: Version) -> (MemIo, Volume, VolumeKey) {
    let size = match version {
        Version::Luks1 => (2 << 20) + 4096,
        Version::Luks2 => LUKS2_DATA_OFFSET + 4096,
    };
    let mut io = MemIo(vec![0; size as usize]);
    let (vol, key) = format(&mut io, &opts(version), PASS).expect("format");
    (io, vol, key)
}

#[test]
fn af_split_merge_round_trip() {
    for hash in [Hash::Sha1, Hash::Sha256, Hash::Sha512] {
        for len in [16usize, 32, 64, 33] {
            for stripes in [1u32, 2, 3, STRIPES] {
                let key: Vec<u8> = (0..len as u8).collect();
                let split = af::split(&key, stripes, hash);
                assert_eq!(split.len(), len * stripes as usize);
                assert_eq!(&af::merge(&split, len, stripes, hash)[..], &key[..], "{hash:?} {len} {stripes}");
                if stripes > 1 {
                    // Any damaged stripe loses the key.
                    let mut bad = split.clone();
                    bad[0] ^= 1;
                    assert_ne!(&af::merge(&bad, len, stripes, hash)[..], &key[..]);
                }
            }
        }
    }
    assert_eq!(af::split_bytes(64, STRIPES), 256_000);
    assert_eq!(af::split_bytes(32, STRIPES), 128_000);
    assert_eq!(af::split_bytes(20, 3), 512);
}

#[test]
fn format_load_unlock_both_versions() {
    for version in [Version::Luks1, Version::Luks2] {
        let (mut io, vol, key) = volume(version);
        let loaded = Volume::load(&mut io).expect("load");
        assert_eq!(loaded.version(), version);
        assert_eq!(loaded.uuid(), vol.uuid());
        assert_eq!(loaded.key_bits(), 256);
        assert_eq!(loaded.cipher(), "aes-xts-plain64");
        assert_eq!(loaded.keyslots(), vol.keyslots());
        let (k, slot) = loaded.unlock(&mut io, PASS, None).expect("unlock");
        assert_eq!((k.as_bytes(), slot), (key.as_bytes(), 0));
        assert!(matches!(loaded.unlock(&mut io, b"nope", None), Err(LuksError::WrongPassphrase)));
        assert!(matches!(loaded.unlock(&mut io, PASS, Some(1)), Err(LuksError::NoSuchSlot(1))));
        let data = loaded.data_offset();
        assert_eq!(loaded.data_size(data + 8192 + 100), 8192);
        assert_eq!(loaded.data_size(data - 1), 0);
    }
    let (mut io, vol, _) = volume(Version::Luks2);
    assert_eq!(vol.label(), Some("unit"));
    assert_eq!(Volume::load(&mut io).expect("load").label(), Some("unit"));
    assert_eq!(vol.data_offset(), 16 << 20);
    let (_, vol1, _) = volume(Version::Luks1);
    assert_eq!(vol1.data_offset(), 4096 * 512);
    assert_eq!(vol1.label(), None);
}

#[test]
fn volume_key_is_never_printed() {
    let (_, _, key) = volume(Version::Luks1);
    let shown = format!("{key:?}");
    assert_eq!(shown, "VolumeKey(256 bits)");
    assert!(VolumeKey::from_bytes(&[1; 31]).is_err());
}

#[test]
fn format_refuses_what_it_cannot_make() {
    let mut small = MemIo(vec![0; 1 << 20]);
    match format(&mut small, &opts(Version::Luks2), PASS) {
        Err(LuksError::TooSmall { need, have }) => {
            assert_eq!((need, have), (LUKS2_DATA_OFFSET + 512, 1 << 20))
        }
        other => panic!("{other:?}"),
    }
    let mut io = MemIo(vec![0; 32 << 20]);
    let refused = |o: FormatOptions, what: &str, io: &mut MemIo| match format(io, &o, PASS) {
        Err(LuksError::Unsupported { what: w, .. }) => assert_eq!(w, what),
        other => panic!("{what}: {other:?}"),
    };
    let mut o = opts(Version::Luks1);
    o.sector_size = 4096;
    refused(o, "sector_size", &mut io);
    let mut o = opts(Version::Luks1);
    o.kdf = Kdf::Argon2 { id: true, time: 4, memory_kib: 32, parallel: 1 };
    refused(o, "kdf", &mut io);
    let mut o = opts(Version::Luks2);
    o.cipher = "serpent-xts-plain64".into();
    refused(o, "cipher", &mut io);
    let mut o = opts(Version::Luks2);
    o.key_bits = 384;
    refused(o, "key_size", &mut io);
    let mut o = opts(Version::Luks2);
    o.kdf = Kdf::Pbkdf2 { hash: "sha256".into(), iterations: 999 };
    refused(o, "kdf iterations", &mut io);
    let mut o = opts(Version::Luks2);
    o.kdf = Kdf::Argon2 { id: true, time: 4, memory_kib: 8 << 20, parallel: 1 };
    refused(o, "kdf memory", &mut io);
    let mut o = opts(Version::Luks2);
    o.label = Some("x".repeat(48));
    refused(o, "label", &mut io);
    assert!(io.0.iter().all(|&b| b == 0), "nothing written before the checks");
}

#[test]
fn not_luks_and_newer_versions() {
    let mut io = MemIo(vec![0; 1 << 20]);
    assert!(matches!(Volume::load(&mut io), Err(LuksError::NotLuks)));
    assert!(matches!(Volume::load(&mut MemIo(vec![0; 10])), Err(LuksError::NotLuks)));
    io.0[..6].copy_from_slice(b"LUKS\xba\xbe");
    io.0[7] = 3;
    assert!(matches!(Volume::load(&mut io), Err(LuksError::NewerVersion(3))));
}

/// Rewrites both LUKS2 copies (valid checksums) after `change` edits the JSON or binary header,
/// without the checks a write makes.
fn rewrite(io: &mut MemIo, change: impl Fn(&mut luks2::Copy)) {
    let vol = Volume::load(io).expect("load");
    let Header::V2(mut c) = vol.header else { panic!("LUKS2") };
    change(&mut c);
    let size = c.bin.hdr_size;
    for offset in [0, size] {
        let bytes = luks2::encode_copy(&c.bin, &c.json, offset).expect("encode");
        io.write_at(offset, &bytes).expect("write");
    }
}

fn slot0(c: &mut luks2::Copy) -> &mut serde_json::Map<String, Value> {
    c.json["keyslots"]["0"].as_object_mut().expect("keyslot 0")
}

#[test]
fn hostile_json_is_refused_naming_the_field() {
    type Edit = fn(&mut luks2::Copy);
    let cases: Vec<(&str, Edit, &str)> = vec![
        ("stripes", |c| slot0(c)["af"]["stripes"] = 1_000_000.into(), "af stripes"),
        (
            "argon2 memory",
            |c| slot0(c)["kdf"] = serde_json::json!({"type": "argon2id", "time": 4, "memory": 8_000_000, "cpus": 1, "salt": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}),
            "kdf memory",
        ),
        (
            "argon2 cpus",
            |c| slot0(c)["kdf"] = serde_json::json!({"type": "argon2i", "time": 4, "memory": 1024, "cpus": 64, "salt": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}),
            "kdf cpus",
        ),
        (
            "requirement",
            |c| c.json["config"]["requirements"] = serde_json::json!({"mandatory": ["online-reencrypt-v3"]}),
            "requirement",
        ),
        ("cipher", |c| c.json["segments"]["0"]["encryption"] = "twofish-cbc-essiv:sha256".into(), "cipher"),
        ("key size", |c| slot0(c)["key_size"] = 128.into(), "key_size"),
        ("kdf type", |c| slot0(c)["kdf"]["type"] = "scrypt".into(), "kdf type"),
        (
            "two segments",
            |c| {
                let seg = c.json["segments"]["0"].clone();
                c.json["segments"]["1"] = seg;
            },
            "segments",
        ),
        ("integrity", |c| c.json["segments"]["0"]["integrity"] = serde_json::json!({}), "integrity"),
    ];
    for (name, edit, what) in cases {
        let (mut io, _, _) = volume(Version::Luks2);
        rewrite(&mut io, edit);
        match Volume::load(&mut io) {
            Err(LuksError::Unsupported { what: w, .. }) => assert_eq!(w, what, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    let damaged: Vec<(&str, Edit, &str)> = vec![
        ("area outside", |c| slot0(c)["area"]["offset"] = "16777216".into(), "outside the key slots area"),
        ("area in the header", |c| slot0(c)["area"]["offset"] = "4096".into(), "outside the key slots area"),
        ("area huge", |c| slot0(c)["area"]["size"] = "18446744073709551615".into(), "overflows"),
        ("area small", |c| slot0(c)["area"]["size"] = "4096".into(), "smaller than the key material"),
        ("offset as a number", |c| slot0(c)["area"]["offset"] = 32768.into(), "not a string"),
        ("size not decimal", |c| slot0(c)["area"]["size"] = "0x1000".into(), "not a decimal string"),
        ("json_size", |c| c.json["config"]["json_size"] = "1000000".into(), "json_size"),
        ("keyslots_size", |c| c.json["config"]["keyslots_size"] = "1073741824".into(), "keyslots_size"),
        ("salt", |c| slot0(c)["kdf"]["salt"] = "!!".into(), "not base64"),
        ("salt length", |c| slot0(c)["kdf"]["salt"] = "AAAA".into(), "3 bytes"),
        ("iterations type", |c| slot0(c)["kdf"]["iterations"] = "1000".into(), "not a non-negative integer"),
        (
            "keyslot id",
            |c| {
                let s = c.json["keyslots"]["0"].clone();
                c.json["keyslots"]["40"] = s;
            },
            "keyslot id",
        ),
        (
            "digest's keyslot",
            |c| c.json["digests"]["0"]["keyslots"] = serde_json::json!(["7"]),
            "does not exist",
        ),
        ("no digest", |c| c.json["digests"]["0"]["segments"] = serde_json::json!([]), "no digest"),
        ("data offset", |c| c.json["segments"]["0"]["offset"] = "65536".into(), "inside the metadata"),
        (
            "priority",
            |c| {
                slot0(c).insert("priority".into(), 7.into());
            },
            "priority",
        ),
        (
            "no tokens",
            |c| {
                c.json.remove("tokens");
            },
            "tokens",
        ),
    ];
    for (name, edit, reason) in damaged {
        let (mut io, _, _) = volume(Version::Luks2);
        rewrite(&mut io, edit);
        match Volume::load(&mut io) {
            Err(LuksError::Damaged { copy: "both", reason: r }) => assert!(r.contains(reason), "{name}: {r}"),
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn luks1_hostile_fields_are_refused() {
    type Edit = fn(&mut [u8]);
    let cases: Vec<(&str, Edit, ErrorKind)> = vec![
        (
            "stripes",
            |h| h[208 + 44..208 + 48].copy_from_slice(&1_000_000u32.to_be_bytes()),
            ErrorKind::Damaged,
        ),
        (
            "material past the data",
            |h| h[208 + 40..208 + 44].copy_from_slice(&4000u32.to_be_bytes()),
            ErrorKind::Damaged,
        ),
        (
            "material in the header",
            |h| h[208 + 40..208 + 44].copy_from_slice(&1u32.to_be_bytes()),
            ErrorKind::Damaged,
        ),
        ("overlap", |h| h[256 + 40..256 + 44].copy_from_slice(&9u32.to_be_bytes()), ErrorKind::Damaged),
        ("active field", |h| h[208..212].copy_from_slice(&7u32.to_be_bytes()), ErrorKind::Damaged),
        ("key bytes", |h| h[108..112].copy_from_slice(&1024u32.to_be_bytes()), ErrorKind::Unsupported),
        ("cipher", |h| h[8..11].copy_from_slice(b"twf"), ErrorKind::Unsupported),
        ("hash", |h| h[72..78].copy_from_slice(b"md5\0\0\0"), ErrorKind::Unsupported),
        ("detached", |h| h[104..108].copy_from_slice(&0u32.to_be_bytes()), ErrorKind::Unsupported),
    ];
    for (name, edit, kind) in cases {
        let (mut io, _, _) = volume(Version::Luks1);
        edit(&mut io.0[..luks1::HEADER_LEN]);
        match Volume::load(&mut io) {
            Err(e) => assert_eq!(e.kind(), kind, "{name}: {e}"),
            Ok(_) => panic!("{name}: loaded"),
        }
    }
}

/// Every flipped byte of either LUKS2 copy: the other copy is used (the volume is the same),
/// or the load is refused; never a different volume.
#[test]
fn luks2_every_flipped_byte_falls_back_or_is_refused() {
    let (mut io, vol, _) = volume(Version::Luks2);
    let want = (vol.uuid().to_owned(), vol.keyslots(), vol.data_offset(), vol.sector_size());
    let copy = LUKS2_COPY_SIZE as usize;
    let mut refused = 0;
    for at in 0..2 * copy {
        io.0[at] ^= 0x55;
        match Volume::load(&mut io) {
            Ok(v) => assert_eq!(
                (v.uuid().to_owned(), v.keyslots(), v.data_offset(), v.sector_size()),
                want,
                "byte {at}"
            ),
            Err(e) => {
                assert!(
                    matches!(e, LuksError::Damaged { .. } | LuksError::NotLuks | LuksError::NewerVersion(_)),
                    "byte {at}: {e}"
                );
                refused += 1;
            }
        }
        io.0[at] ^= 0x55;
    }
    // One copy intact always loads: nothing is refused.
    assert_eq!(refused, 0);
    // The primary zeroed: the secondary opens.
    io.0[..luks2::BIN_LEN].fill(0);
    let v = Volume::load(&mut io).expect("secondary");
    assert!(v.unlock(&mut io, PASS, None).is_ok());
    // Both broken: Damaged { both }.
    io.0[copy + 100] ^= 1;
    assert!(matches!(Volume::load(&mut io), Err(LuksError::Damaged { copy: "both", .. })));
}

/// Every flipped byte of the LUKS1 header: refused, or a volume whose unlock gives the volume
/// key or refuses (the digest catches a wrong key), never another key.
#[test]
fn luks1_every_flipped_byte_is_refused_or_harmless() {
    let (mut io, _, key) = volume(Version::Luks1);
    for at in 0..luks1::HEADER_LEN {
        io.0[at] ^= 0x55;
        if let Ok(v) = Volume::load(&mut io) {
            // A flipped iteration count may ask for billions of rounds: a valid header, only
            // slow to open (cryptsetup's own limit is 2^32 - 1). Its load is the check.
            let Header::V1(h) = &v.header else { panic!("LUKS1") };
            if h.mk_iterations > 100_000 || h.slots.iter().any(|s| s.iterations > 100_000) {
                io.0[at] ^= 0x55;
                continue;
            }
            match v.unlock(&mut io, PASS, None) {
                Ok((k, _)) => assert_eq!(k.as_bytes(), key.as_bytes(), "byte {at}"),
                Err(e) => assert!(
                    matches!(
                        e,
                        LuksError::WrongPassphrase | LuksError::Unsupported { .. } | LuksError::Io(_)
                    ),
                    "byte {at}: {e}"
                ),
            }
        }
        io.0[at] ^= 0x55;
    }
}

/// Two valid copies with different contents: the higher seqid wins, the primary on a tie.
#[test]
fn luks2_seqid_rule() {
    let (mut io, mut vol, key) = volume(Version::Luks2);
    let before = io.clone();
    vol.add_keyslot(&mut io, &key, b"second", None, &pbkdf2()).expect("add");
    let seq = |io: &mut MemIo| {
        let v = Volume::load(io).expect("load");
        let Header::V2(c) = &v.header else { panic!("LUKS2") };
        (c.bin.seqid, v.keyslots().len())
    };
    let (new_seq, _) = seq(&mut io);
    let copy = LUKS2_COPY_SIZE as usize;
    // Old primary, new secondary: the secondary (higher seqid) wins.
    let mut mixed = io.clone();
    mixed.0[..copy].copy_from_slice(&before.0[..copy]);
    assert_eq!(seq(&mut mixed), (new_seq, 2));
    // New primary, old secondary: the primary.
    let mut mixed = io.clone();
    mixed.0[copy..2 * copy].copy_from_slice(&before.0[copy..2 * copy]);
    assert_eq!(seq(&mut mixed), (new_seq, 2));
    // Equal seqids with different contents: the primary.
    let mut tie = io.clone();
    rewrite(&mut tie, |_| {});
    let Header::V2(old) = Volume::load(&mut before.clone()).expect("old").header else { panic!() };
    let mut bin = old.bin.clone();
    bin.seqid = new_seq;
    let secondary = luks2::encode_copy(&bin, &old.json, LUKS2_COPY_SIZE).expect("encode");
    tie.0[copy..2 * copy].copy_from_slice(&secondary);
    assert_eq!(seq(&mut tie), (new_seq, 2));
}

#[test]
fn slot_rules() {
    for version in [Version::Luks1, Version::Luks2] {
        let (mut io, mut vol, key) = volume(version);
        assert!(matches!(vol.remove_keyslot(&mut io, 0), Err(LuksError::LastSlot)));
        assert!(matches!(vol.remove_keyslot(&mut io, 5), Err(LuksError::NoSuchSlot(5))));
        assert!(matches!(
            vol.add_keyslot(&mut io, &key, b"x", Some(0), &pbkdf2()),
            Err(LuksError::NoSuchSlot(0))
        ));
        let other = VolumeKey::from_bytes(&[7; 32]).expect("key");
        assert!(matches!(
            vol.add_keyslot(&mut io, &other, b"x", None, &pbkdf2()),
            Err(LuksError::Unsupported { what: "volume key", .. })
        ));
        let n = vol.add_keyslot(&mut io, &key, b"two", None, &pbkdf2()).expect("add");
        assert_eq!(n, 1);
        let (k, slot) = Volume::load(&mut io).expect("load").unlock(&mut io, b"two", None).expect("unlock");
        assert_eq!((k.as_bytes(), slot), (key.as_bytes(), 1));
        let area = vol.keyslots()[0].clone();
        vol.remove_keyslot(&mut io, 0).expect("remove");
        let wiped = &io.0[area.area_offset as usize..(area.area_offset + area.area_size) as usize];
        assert!(wiped.iter().all(|&b| b == 0), "slot 0's area wiped");
        let loaded = Volume::load(&mut io).expect("load");
        assert_eq!(loaded.keyslots().iter().map(|k| k.slot).collect::<Vec<_>>(), vec![1]);
        assert!(matches!(loaded.unlock(&mut io, PASS, None), Err(LuksError::WrongPassphrase)));
    }
    // LUKS1 has eight slots.
    let (mut io, mut vol, key) = volume(Version::Luks1);
    for n in 1..8 {
        assert_eq!(vol.add_keyslot(&mut io, &key, b"more", None, &pbkdf2()).expect("add"), n);
    }
    assert!(matches!(vol.add_keyslot(&mut io, &key, b"more", None, &pbkdf2()), Err(LuksError::NoFreeSlot)));
}

/// LUKS2 holds 32 slots (all fit the default 12 KiB JSON area); a slot that does not fit the
/// JSON area (here a large token fills it) is NoFreeSlot, and nothing is written.
#[test]
fn luks2_slot_limits() {
    let (mut io, mut vol, key) = volume(Version::Luks2);
    for n in 1..luks2::MAX_KEYSLOTS {
        assert_eq!(vol.add_keyslot(&mut io, &key, b"more", None, &pbkdf2()).expect("add"), n);
    }
    assert!(matches!(vol.add_keyslot(&mut io, &key, b"more", None, &pbkdf2()), Err(LuksError::NoFreeSlot)));
    let loaded = Volume::load(&mut io).expect("load");
    assert_eq!(loaded.keyslots().len(), 32);
    assert_eq!(loaded.unlock(&mut io, b"more", Some(31)).expect("the last slot opens").1, 31);

    let (mut io, _, key) = volume(Version::Luks2);
    rewrite(&mut io, |c| {
        c.json["tokens"]["0"] =
            serde_json::json!({"type": "filler", "keyslots": [], "x": "y".repeat(11_300)});
    });
    let mut vol = Volume::load(&mut io).expect("load");
    let before = io.clone();
    assert!(matches!(vol.add_keyslot(&mut io, &key, b"more", None, &pbkdf2()), Err(LuksError::NoFreeSlot)));
    assert!(io.0 == before.0, "nothing written");
    assert_eq!(vol.keyslots().len(), 1);
}

#[test]
fn luks2_priority_order() {
    let (mut io, mut vol, key) = volume(Version::Luks2);
    vol.add_keyslot(&mut io, &key, PASS, Some(4), &pbkdf2()).expect("add");
    vol.add_keyslot(&mut io, &key, PASS, Some(2), &pbkdf2()).expect("add");
    // Slot 4 preferred, slot 0 ignored: 4 opens first; 0 only when named.
    rewrite(&mut io, |c| {
        c.json["keyslots"]["4"]["priority"] = 2.into();
        c.json["keyslots"]["0"]["priority"] = 0.into();
    });
    let vol = Volume::load(&mut io).expect("load");
    assert_eq!(vol.unlock(&mut io, PASS, None).expect("unlock").1, 4);
    assert_eq!(vol.unlock_order(), vec![4, 2]);
    assert_eq!(vol.unlock(&mut io, PASS, Some(0)).expect("named").1, 0);
    let prio: Vec<_> = vol.keyslots().into_iter().map(|k| k.priority).collect();
    assert_eq!(prio, vec![Some("ignore".into()), None, Some("prefer".into())]);
}

/// A device that fails every write after the first `budget`: a crash in the middle of an
/// update.
struct Crashing {
    io: MemIo,
    budget: usize,
}

impl MetaIo for Crashing {
    fn size(&self) -> u64 {
        self.io.size()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.io.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        if self.budget == 0 {
            return Err(std::io::Error::other("crashed"));
        }
        self.budget -= 1;
        self.io.write_at(offset, buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A crash after any write of an add or a remove leaves a header every slot of which opens.
#[test]
fn key_slot_changes_survive_a_crash_at_every_write() {
    for version in [Version::Luks1, Version::Luks2] {
        let (io, vol, key) = volume(version);
        for budget in 0..4 {
            let mut dev = Crashing { io: io.clone(), budget };
            let mut v = vol.clone();
            let added = v.add_keyslot(&mut dev, &key, b"new", None, &pbkdf2());
            let loaded = Volume::load(&mut dev.io).expect("a header survives");
            for slot in loaded.keyslots() {
                let pass: &[u8] = if slot.slot == 0 { PASS } else { b"new" };
                let (k, _) =
                    loaded.unlock(&mut dev.io, pass, Some(slot.slot)).expect("every listed slot opens");
                assert_eq!(k.as_bytes(), key.as_bytes());
            }
            // The old header (one slot) or the new one (two); a completed add is the new one.
            let slots = loaded.keyslots().len();
            assert!(slots == 1 || slots == 2, "{version:?} budget {budget}: {slots} slots");
            assert!(added.is_err() || slots == 2, "{version:?} budget {budget}");
            // Now remove slot 0 with a crash after `budget` writes.
            if added.is_ok() {
                let mut dev = Crashing { io: dev.io.clone(), budget: budget.min(2) };
                let _ = v.remove_keyslot(&mut dev, 0);
                let loaded = Volume::load(&mut dev.io).expect("a header survives");
                for slot in loaded.keyslots() {
                    let pass: &[u8] = if slot.slot == 0 { PASS } else { b"new" };
                    loaded.unlock(&mut dev.io, pass, Some(slot.slot)).expect("every listed slot opens");
                }
            }
        }
    }
}

#[test]
fn header_round_trip() {
    for version in [Version::Luks1, Version::Luks2] {
        let (io, vol, _) = volume(version);
        let mut copy = MemIo(vec![0; io.0.len()]);
        for (offset, bytes) in vol.encode_header().expect("encode") {
            copy.write_at(offset, &bytes).expect("write");
        }
        let again = Volume::load(&mut copy).expect("load");
        assert_eq!(again.keyslots(), vol.keyslots());
        assert_eq!(again.uuid(), vol.uuid());
    }
}
