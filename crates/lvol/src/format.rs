//! Encoding and decoding of every on-disk structure (docs/lvol-format.md): the label (page 0,
//! written once), the super block (the first page of each of the two metadata areas) and the
//! volume stream (the pages after it). All integers are little-endian.
//!
//! Decoders take hostile bytes: every length is checked against what is left before anything is
//! allocated or indexed, and every problem is an `Err` with a reason, never a panic. They check
//! structure only; what needs the whole store (parents, cluster ownership, the free count) is
//! checked by the store's load.

use crate::crc::crc32c;
use crate::{ExternalParent, Page, Uuid, Volume, NAME_MAX, PAGE_SIZE, UNALLOCATED};

pub const LABEL_MAGIC: [u8; 8] = *b"FPLVLABL";
pub const SUPER_MAGIC: [u8; 8] = *b"FPLVSUPR";
/// The format version this code writes and the only one it reads.
pub const VERSION: u32 = 1;

/// Bytes of the label's fields (the rest of page 0 is zero).
const LABEL_LEN: usize = 48;
/// Bytes of the super block before its page-checksum table.
pub const SUPER_HEADER: usize = 160;
/// Stream pages one super block can vouch for (one CRC each): 984 pages, 3.8 MiB of
/// metadata, about 1,000,000 map entries (3.8 TiB of volumes at 4 MiB clusters).
pub const MAX_STREAM_PAGES: usize = (PAGE_SIZE - SUPER_HEADER) / 4;

/// The highest generation a super block may hold: 2^63, a store committing a million times a
/// second for 290,000 years. Far below u64::MAX, so every store that loads has as many
/// commits ahead of it (a commit past it is refused).
pub const MAX_GENERATION: u64 = 1 << 63;
/// Largest metadata area: its super block and the most stream pages it can vouch for.
pub const MAX_AREA_PAGES: u32 = MAX_STREAM_PAGES as u32 + 1;

pub const FLAG_THIN: u32 = 1;
pub const FLAG_READ_ONLY: u32 = 2;
pub const FLAG_SNAPSHOT: u32 = 4;
/// The record ends with an external parent (an esnap: any bdev as the chain's last layer). A
/// store without one is byte for byte what version 1 wrote; a build that predates the flag
/// refuses a record carrying it ("unknown flags") rather than misreading it.
pub const FLAG_EXTERNAL: u32 = 8;
const KNOWN_FLAGS: u32 = FLAG_THIN | FLAG_READ_ONLY | FLAG_SNAPSHOT | FLAG_EXTERNAL;

/// Bytes of an external parent's field besides its name: its size in clusters, the name length.
pub const EXTERNAL_FIXED: u64 = 8 + 1;

/// Bytes of a volume record besides its name and map: uuid, parent, flags, name length, size.
pub const RECORD_FIXED: u64 = 16 + 16 + 4 + 1 + 8;
/// Bytes of the stream besides its records: the volume count.
pub const STREAM_FIXED: u64 = 4;

/// The checksum field's place in the label and the super block (computed with it zeroed).
pub const CRC_AT: usize = 12;

/// Smallest and largest cluster (a page, and 1 GiB) and block sizes (512 B to a page).
pub fn check_geometry(cluster_size: u64, block_size: u32) -> Result<(), String> {
    if !cluster_size.is_power_of_two() || cluster_size < PAGE_SIZE as u64 || cluster_size > 1 << 30 {
        return Err(format!("cluster size {cluster_size} is not a power of two from 4 KiB to 1 GiB"));
    }
    if !block_size.is_power_of_two() || !(512..=PAGE_SIZE as u32).contains(&block_size) {
        return Err(format!("block size {block_size} is not a power of two from 512 to 4096"));
    }
    Ok(())
}

/// Page 0: what never changes after the store is created, so that the two metadata areas can
/// be found even when both of their super blocks are damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label {
    pub uuid: Uuid,
    pub cluster_size: u64,
    pub block_size: u32,
    /// Pages of each metadata area (its super block included).
    pub area_pages: u32,
}

impl Label {
    /// First page of metadata area 0 or 1.
    pub fn area_start(&self, area: usize) -> u64 {
        1 + area as u64 * self.area_pages as u64
    }

    /// Byte offset of data cluster 0: the first cluster boundary after both areas.
    pub fn data_offset(&self) -> u64 {
        let md_end = (1 + 2 * self.area_pages as u64) * PAGE_SIZE as u64;
        md_end.div_ceil(self.cluster_size) * self.cluster_size
    }

    /// Data clusters a device of `size_pages` pages holds.
    pub fn clusters_in(&self, size_pages: u64) -> u64 {
        let bytes = size_pages.saturating_mul(PAGE_SIZE as u64);
        bytes.saturating_sub(self.data_offset()) / self.cluster_size
    }

    pub fn encode(&self) -> Box<Page> {
        let mut p = Box::new([0u8; PAGE_SIZE]);
        let mut w = Writer::new(&mut p[..]);
        w.bytes(&LABEL_MAGIC);
        w.u32(VERSION);
        w.u32(0);
        w.bytes(&self.uuid.0);
        w.u64(self.cluster_size);
        w.u32(self.block_size);
        w.u32(self.area_pages);
        seal(&mut p);
        p
    }

    /// `Ok(None)` when the page is not a label at all (no magic): the device holds no store.
    pub fn decode(p: &Page) -> Result<Option<Label>, String> {
        if p[..8] != LABEL_MAGIC {
            return Ok(None);
        }
        check_seal(p, "label")?;
        let mut r = Reader::new(&p[8..]);
        let version = r.u32()?;
        if version != VERSION {
            return Err(format!("label: format version {version}, this build reads {VERSION}"));
        }
        r.u32()?;
        let label = Label {
            uuid: Uuid(r.array()?),
            cluster_size: r.u64()?,
            block_size: r.u32()?,
            area_pages: r.u32()?,
        };
        if p[LABEL_LEN..].iter().any(|&b| b != 0) {
            return Err("label: bytes after its fields".into());
        }
        check_geometry(label.cluster_size, label.block_size).map_err(|e| format!("label: {e}"))?;
        if !(2..=MAX_AREA_PAGES).contains(&label.area_pages) {
            return Err(format!(
                "label: {} pages per metadata area, not 2 to {MAX_AREA_PAGES}",
                label.area_pages
            ));
        }
        if label.uuid.is_nil() {
            return Err("label: nil uuid".into());
        }
        Ok(Some(label))
    }
}

/// The first page of a metadata area: the store's mutable header, and the checksums of the
/// area's stream pages, so an area is valid only if every page of it is the one this super
/// block was written with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuperBlock {
    pub generation: u64,
    pub uuid: Uuid,
    pub cluster_size: u64,
    pub block_size: u32,
    pub area_pages: u32,
    pub total_clusters: u64,
    pub free_clusters: u64,
    pub stream_len: u64,
    pub name: String,
    /// CRC-32C of each stream page, in order; as many as the stream has pages.
    pub page_crcs: Vec<u32>,
}

impl SuperBlock {
    pub fn encode(&self) -> Box<Page> {
        debug_assert!(self.page_crcs.len() <= MAX_STREAM_PAGES && self.name.len() <= NAME_MAX);
        let mut p = Box::new([0u8; PAGE_SIZE]);
        let mut w = Writer::new(&mut p[..]);
        w.bytes(&SUPER_MAGIC);
        w.u32(VERSION);
        w.u32(0);
        w.u64(self.generation);
        w.bytes(&self.uuid.0);
        w.u64(self.cluster_size);
        w.u32(self.block_size);
        w.u32(PAGE_SIZE as u32);
        w.u32(self.area_pages);
        w.u32(self.page_crcs.len() as u32);
        w.u64(self.total_clusters);
        w.u64(self.free_clusters);
        w.u64(self.stream_len);
        w.u8(self.name.len() as u8);
        w.bytes(self.name.as_bytes());
        let mut w = Writer::new(&mut p[SUPER_HEADER..]);
        for &c in &self.page_crcs {
            w.u32(c);
        }
        seal(&mut p);
        p
    }

    pub fn decode(p: &Page) -> Result<SuperBlock, String> {
        if p[..8] != SUPER_MAGIC {
            return Err("no super block magic".into());
        }
        check_seal(p, "super block")?;
        let mut r = Reader::new(&p[8..SUPER_HEADER]);
        let version = r.u32()?;
        if version != VERSION {
            return Err(format!("format version {version}, this build reads {VERSION}"));
        }
        r.u32()?;
        let generation = r.u64()?;
        let uuid = Uuid(r.array()?);
        let cluster_size = r.u64()?;
        let block_size = r.u32()?;
        let page_size = r.u32()?;
        let area_pages = r.u32()?;
        let stream_pages = r.u32()? as usize;
        let total_clusters = r.u64()?;
        let free_clusters = r.u64()?;
        let stream_len = r.u64()?;
        let name_len = r.u8()? as usize;
        let name_field: [u8; NAME_MAX] = r.array()?;
        // Generation 1 is the first a store writes. A generation near u64::MAX would leave no
        // next one: the fuzz target found stores that loaded and could not commit (u64::MAX),
        // and one that committed u64::MAX and then loaded its older copy (u64::MAX - 1).
        if generation == 0 || generation > MAX_GENERATION {
            return Err(format!("generation {generation} out of range"));
        }
        if page_size != PAGE_SIZE as u32 {
            return Err(format!("page size {page_size}, not {PAGE_SIZE}"));
        }
        check_geometry(cluster_size, block_size)?;
        if name_len > NAME_MAX || name_field[name_len..].iter().any(|&b| b != 0) {
            return Err(format!("store name of {name_len} bytes or with bytes after its end"));
        }
        let name = std::str::from_utf8(&name_field[..name_len])
            .map_err(|_| "store name is not UTF-8".to_string())?
            .to_string();
        crate::check_name("lvs_name", &name).map_err(|e| e.to_string())?;
        if stream_pages == 0 || stream_pages > MAX_STREAM_PAGES || stream_pages as u64 >= area_pages as u64 {
            return Err(format!("{stream_pages} stream pages in an area of {area_pages}"));
        }
        let page = PAGE_SIZE as u64;
        if stream_len < STREAM_FIXED || stream_len.div_ceil(page) != stream_pages as u64 {
            return Err(format!("stream of {stream_len} bytes in {stream_pages} pages"));
        }
        if free_clusters > total_clusters {
            return Err(format!("{free_clusters} free clusters of {total_clusters}"));
        }
        let mut r = Reader::new(&p[SUPER_HEADER..]);
        let page_crcs = (0..stream_pages).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
        if p[SUPER_HEADER + 4 * stream_pages..].iter().any(|&b| b != 0) {
            return Err("bytes after the page checksums".into());
        }
        Ok(SuperBlock {
            generation,
            uuid,
            cluster_size,
            block_size,
            area_pages,
            total_clusters,
            free_clusters,
            stream_len,
            name,
            page_crcs,
        })
    }
}

// A volume's flags and record length are facts of its on-disk record.
impl Volume {
    /// The flags its record carries.
    pub fn flags(&self) -> u32 {
        (if self.thin { FLAG_THIN } else { 0 })
            | (if self.read_only { FLAG_READ_ONLY } else { 0 })
            | (if self.snapshot { FLAG_SNAPSHOT } else { 0 })
            | (if self.external.is_some() { FLAG_EXTERNAL } else { 0 })
    }

    /// Bytes of the volume's record in the stream.
    pub fn record_len(&self) -> u64 {
        record_len(self.name.len(), self.map.len() as u64)
            + self.external.as_ref().map_or(0, |e| external_len(e.name.len()))
    }
}

/// Length of a record in the stream without an external parent.
pub fn record_len(name_len: usize, clusters: u64) -> u64 {
    RECORD_FIXED + name_len as u64 + 4 * clusters
}

/// Length of an external parent's field (after the map).
pub fn external_len(name_len: usize) -> u64 {
    EXTERNAL_FIXED + name_len as u64
}

/// The stream: the volume count, then each volume's record (uuid, parent uuid or nil, flags,
/// name, size in clusters, cluster map, and with [`FLAG_EXTERNAL`] the external parent: its
/// size in clusters, name length, name).
pub fn encode_stream(volumes: &[Volume]) -> Vec<u8> {
    let len = STREAM_FIXED + volumes.iter().map(Volume::record_len).sum::<u64>();
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(&(volumes.len() as u32).to_le_bytes());
    for v in volumes {
        out.extend_from_slice(&v.uuid.0);
        out.extend_from_slice(&v.parent.unwrap_or(Uuid::NIL).0);
        out.extend_from_slice(&v.flags().to_le_bytes());
        out.push(v.name.len() as u8);
        out.extend_from_slice(v.name.as_bytes());
        out.extend_from_slice(&(v.map.len() as u64).to_le_bytes());
        for &c in &v.map {
            out.extend_from_slice(&c.to_le_bytes());
        }
        if let Some(e) = &v.external {
            out.extend_from_slice(&e.clusters.to_le_bytes());
            out.push(e.name.len() as u8);
            out.extend_from_slice(e.name.as_bytes());
        }
    }
    debug_assert_eq!(out.len() as u64, len);
    out
}

/// Decodes a whole stream (exactly: trailing bytes are an error). Map entries are returned as
/// stored; the store checks them against its clusters.
pub fn decode_stream(bytes: &[u8]) -> Result<Vec<Volume>, String> {
    let mut r = Reader::new(bytes);
    let count = r.u32()? as u64;
    // Every record takes at least RECORD_FIXED bytes: refuse a count the bytes cannot hold
    // before reserving room for it.
    if count > r.left() as u64 / RECORD_FIXED {
        return Err(format!("{count} volumes in a stream of {} bytes", bytes.len()));
    }
    let mut volumes = Vec::with_capacity(count as usize);
    for i in 0..count {
        let uuid = Uuid(r.array()?);
        let parent = Uuid(r.array()?);
        let flags = r.u32()?;
        let name_len = r.u8()? as usize;
        let name = std::str::from_utf8(r.take(name_len)?)
            .map_err(|_| format!("volume {i}: name is not UTF-8"))?
            .to_string();
        let clusters = r.u64()?;
        if clusters > r.left() as u64 / 4 {
            return Err(format!("volume {i}: {clusters} clusters, more than the stream holds"));
        }
        let map = (0..clusters).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(format!("volume {i}: unknown flags {flags:#x}"));
        }
        let external = if flags & FLAG_EXTERNAL != 0 {
            let clusters = r.u64()?;
            let len = r.u8()? as usize;
            let name = std::str::from_utf8(r.take(len)?)
                .map_err(|_| format!("volume {i}: external parent's name is not UTF-8"))?
                .to_string();
            if name.is_empty() || clusters == 0 {
                return Err(format!("volume {i}: external parent with an empty name or no clusters"));
            }
            Some(ExternalParent { name, clusters })
        } else {
            None
        };
        volumes.push(Volume {
            uuid,
            name,
            parent: (!parent.is_nil()).then_some(parent),
            thin: flags & FLAG_THIN != 0,
            read_only: flags & FLAG_READ_ONLY != 0,
            snapshot: flags & FLAG_SNAPSHOT != 0,
            map,
            external,
        });
    }
    if r.left() != 0 {
        return Err(format!("{} bytes after the last volume", r.left()));
    }
    Ok(volumes)
}

/// Splits a stream into pages (the last one zero-padded).
pub fn stream_pages(stream: &[u8]) -> Vec<Box<Page>> {
    stream
        .chunks(PAGE_SIZE)
        .map(|c| {
            let mut p = Box::new([0u8; PAGE_SIZE]);
            p[..c.len()].copy_from_slice(c);
            p
        })
        .collect()
}

/// A map entry that names a cluster (not [`UNALLOCATED`]).
pub fn is_mapped(entry: u32) -> bool {
    entry != UNALLOCATED
}

/// Sets the checksum of a label or super block page (the fuzz target re-seals mutated pages
/// with it, so that its inputs get past the checksums to the decoders behind them).
pub fn seal(p: &mut Page) {
    p[CRC_AT..CRC_AT + 4].fill(0);
    let crc = crc32c(&p[..]);
    p[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

fn check_seal(p: &Page, what: &str) -> Result<(), String> {
    let stored = u32::from_le_bytes(p[CRC_AT..CRC_AT + 4].try_into().expect("4 bytes"));
    let mut copy = *p;
    copy[CRC_AT..CRC_AT + 4].fill(0);
    let crc = crc32c(&copy[..]);
    if crc != stored {
        return Err(format!("{what} checksum {stored:#010x}, computed {crc:#010x}"));
    }
    Ok(())
}

struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }
    fn bytes(&mut self, b: &[u8]) {
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }
    fn u8(&mut self, v: u8) {
        self.bytes(&[v]);
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.left() {
            return Err(format!("truncated: {n} bytes wanted at offset {}, {} left", self.pos, self.left()));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(name: &str, map: Vec<u32>) -> Volume {
        Volume {
            uuid: Uuid([name.len() as u8; 16]),
            name: name.into(),
            parent: Some(Uuid([9; 16])),
            thin: true,
            read_only: false,
            snapshot: false,
            map,
            external: None,
        }
    }

    #[test]
    fn label_round_trip_and_damage() {
        let l = Label { uuid: Uuid([7; 16]), cluster_size: 1 << 20, block_size: 512, area_pages: 8 };
        let p = l.encode();
        assert_eq!(Label::decode(&p).unwrap(), Some(l));
        assert_eq!(Label::decode(&[0u8; PAGE_SIZE]).unwrap(), None);
        for i in 8..64 {
            let mut bad = *p;
            bad[i] ^= 0x10;
            assert!(Label::decode(&bad).is_err(), "byte {i} flipped");
        }
        assert_eq!(l.area_start(0), 1);
        assert_eq!(l.area_start(1), 9);
        // 17 pages of metadata round up to the first 1 MiB boundary.
        assert_eq!(l.data_offset(), 1 << 20);
        assert_eq!(l.clusters_in(4 * 256), 3);
    }

    #[test]
    fn super_block_round_trip_and_damage() {
        let sb = SuperBlock {
            generation: 42,
            uuid: Uuid([3; 16]),
            cluster_size: 4 << 20,
            block_size: 4096,
            area_pages: 10,
            total_clusters: 100,
            free_clusters: 60,
            stream_len: 5000,
            name: "lvs0".into(),
            page_crcs: vec![1, 2],
        };
        let p = sb.encode();
        assert_eq!(SuperBlock::decode(&p).unwrap(), sb);
        for i in 0..SUPER_HEADER + 8 {
            let mut bad = *p;
            bad[i] ^= 1;
            assert!(SuperBlock::decode(&bad).is_err(), "byte {i} flipped");
        }
        for generation in [0, MAX_GENERATION + 1, u64::MAX - 1, u64::MAX] {
            let p = SuperBlock { generation, ..sb.clone() }.encode();
            assert!(SuperBlock::decode(&p).unwrap_err().contains("out of range"), "{generation}");
        }
        let last = SuperBlock { generation: MAX_GENERATION, ..sb.clone() };
        assert_eq!(SuperBlock::decode(&last.encode()).unwrap(), last);
        // A stream length that does not fill its pages' count is refused even if sealed.
        let p = SuperBlock { stream_len: 9000, ..sb.clone() }.encode();
        assert!(SuperBlock::decode(&p).unwrap_err().contains("stream of 9000 bytes"));
    }

    #[test]
    fn stream_round_trip() {
        let mut esnap = vol("e", vec![UNALLOCATED, 3]);
        esnap.parent = None;
        esnap.external = Some(ExternalParent { name: "golden".into(), clusters: 2 });
        let vols = vec![vol("a", vec![0, UNALLOCATED, 5]), vol("bb", vec![]), esnap];
        let s = encode_stream(&vols);
        assert_eq!(s.len() as u64, STREAM_FIXED + vols.iter().map(Volume::record_len).sum::<u64>());
        assert_eq!(decode_stream(&s).unwrap(), vols);
        assert!(decode_stream(&[]).is_err());
        // Every cut of the external field is an error, not a shorter record.
        for cut in s.len() - 15..s.len() {
            assert!(decode_stream(&s[..cut]).is_err(), "cut at {cut}");
        }
    }

    /// A stream without external parents is what version 1 wrote: the flag's field is absent.
    #[test]
    fn streams_without_external_parents_keep_the_version_1_layout() {
        let s = encode_stream(&[vol("a", vec![1, 2])]);
        assert_eq!(s.len() as u64, STREAM_FIXED + record_len(1, 2));
        assert_eq!(u32::from_le_bytes(s[36..40].try_into().unwrap()) & FLAG_EXTERNAL, 0);
    }

    #[test]
    fn hostile_streams_are_errors() {
        let s = encode_stream(&[vol("a", vec![1, 2, 3])]);
        for cut in 0..s.len() {
            assert!(decode_stream(&s[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = s.clone();
        long.push(0);
        assert!(decode_stream(&long).unwrap_err().contains("after the last volume"));
        // A count or cluster number far past what the bytes hold fails fast, allocating nothing.
        let mut huge = s.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_stream(&huge).is_err());
        let mut huge = s.clone();
        let at = 4 + RECORD_FIXED as usize - 8 + 1;
        huge[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_stream(&huge).unwrap_err().contains("more than the stream holds"));
        let mut flags = s;
        flags[4 + 32] = 0x80;
        assert!(decode_stream(&flags).unwrap_err().contains("unknown flags"));
    }
}
