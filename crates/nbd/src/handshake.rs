//! Option haggling, without I/O: [`Negotiation`] takes one option at a time (header and data)
//! and appends the server's replies to a buffer; the caller moves the bytes (and runs the TLS
//! handshake when told to). Keeping it free of sockets lets the fuzz target drive it with
//! arbitrary bytes. The rules are the protocol document's "Option haggling" and "Option
//! types" sections.

use crate::proto::*;

/// The most options one connection may send before it must pick an export: enough for any
/// client (qemu sends fewer than ten), small enough that a flood costs little.
pub const MAX_OPTIONS: u32 = 1024;

/// The largest option data accepted; longer options close the connection. Names are at most
/// 4 KiB, so a legitimate option is far smaller.
pub const MAX_OPTION_LEN: u32 = 64 << 10;

/// The longest export name or metadata query accepted (the protocol's own limit).
const MAX_STRING: usize = 4096;

/// What the negotiation needs to know of an export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    /// Transmission flags (`TFLAG_*`).
    pub flags: u16,
    /// The minimum block size: the device's block size.
    pub min_block: u32,
    pub description: String,
    /// The dirty bitmaps it offers as `qemu:dirty-bitmap:NAME` contexts, in id order.
    pub bitmaps: Vec<String>,
}

/// The server's exports, as the negotiation sees them.
pub trait ExportLookup {
    type Export;
    /// The export called `name`; the empty name selects a listener's only export. `Err` is the
    /// message of an NBD_REP_ERR_UNKNOWN.
    fn find(&self, name: &str) -> Result<(String, Self::Export), String>;
    /// Every export's name, for NBD_OPT_LIST.
    fn names(&self) -> Vec<String>;
    fn info(&self, export: &Self::Export) -> ExportInfo;
}

/// What the caller does after an option.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<E> {
    /// Send what was appended, then read the next option.
    Continue,
    /// Send the ACK appended, run the TLS handshake, then go on with [`Negotiation::tls_started`].
    StartTls,
    /// Send what was appended (best effort) and close: the client gave up.
    Abort,
    /// Close without a word: the stream cannot go on (the reason is for the log).
    Close(String),
    /// Send what was appended, then serve `export` in the transmission phase.
    Go(Transmission<E>),
}

/// What the transmission phase starts with.
#[derive(Debug, PartialEq, Eq)]
pub struct Transmission<E> {
    pub name: String,
    pub export: E,
    pub structured: bool,
    /// `base:allocation` was selected (its id is [`BASE_ALLOCATION_ID`]).
    pub allocation: bool,
    /// The export's bitmaps selected, by their index in [`ExportInfo::bitmaps`] (context id
    /// [`FIRST_BITMAP_ID`] + index), in order.
    pub bitmaps: Vec<u32>,
}

/// The metadata contexts SET_META_CONTEXT selected, and the export they hold for.
#[derive(Debug)]
struct Selected {
    export: String,
    allocation: bool,
    bitmaps: Vec<u32>,
}

/// One connection's negotiation state.
#[derive(Debug)]
pub struct Negotiation {
    tls_offered: bool,
    tls_active: bool,
    no_zeroes: bool,
    structured: bool,
    /// The contexts the last SET_META_CONTEXT selected.
    selected: Option<Selected>,
    options: u32,
}

/// A cursor over an option's data, every read checked.
struct Data<'a>(&'a [u8]);

impl<'a> Data<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A length-prefixed UTF-8 string of at most [`MAX_STRING`] bytes.
    fn string(&mut self) -> Option<&'a str> {
        let len = self.u32()? as usize;
        if len > MAX_STRING {
            return None;
        }
        std::str::from_utf8(self.take(len)?).ok()
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// An option's data did not parse: the reply to send.
struct Invalid(&'static str);

impl Negotiation {
    /// `tls` says whether this listener serves TLS; when it does, every export on it requires it.
    pub fn new(tls: bool) -> Negotiation {
        Negotiation {
            tls_offered: tls,
            tls_active: false,
            no_zeroes: false,
            structured: false,
            selected: None,
            options: 0,
        }
    }

    /// The client's flags, right after the greeting. `Err` closes the connection.
    pub fn client_flags(&mut self, flags: u32) -> Result<(), String> {
        if flags & CLIENT_FLAG_FIXED_NEWSTYLE == 0 {
            return Err("client does not speak fixed newstyle negotiation".into());
        }
        if flags & !(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES) != 0 {
            return Err(format!("unknown client flags {flags:#x}"));
        }
        self.no_zeroes = flags & CLIENT_FLAG_NO_ZEROES != 0;
        Ok(())
    }

    /// Checks an option header before its data is read: `Err` closes the connection.
    pub fn check_header(&mut self, header: &OptionHeader) -> Result<(), String> {
        self.options += 1;
        if self.options > MAX_OPTIONS {
            return Err(format!("more than {MAX_OPTIONS} options without choosing an export"));
        }
        if header.length > MAX_OPTION_LEN {
            return Err(format!(
                "option {} carries {} bytes, over {MAX_OPTION_LEN}",
                header.option, header.length
            ));
        }
        Ok(())
    }

    /// The TLS handshake succeeded: the rest goes over TLS, which the exports require.
    pub fn tls_started(&mut self) {
        self.tls_active = true;
    }

    /// Handles one option; replies go to `out`.
    pub fn option<L: ExportLookup>(
        &mut self,
        exports: &L,
        header: OptionHeader,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Step<L::Export> {
        let opt = header.option;
        if self.tls_offered && !self.tls_active && !matches!(opt, OPT_STARTTLS | OPT_ABORT) {
            if opt == OPT_EXPORT_NAME {
                return Step::Close("NBD_OPT_EXPORT_NAME before STARTTLS on a TLS listener".into());
            }
            error(out, opt, REP_ERR_TLS_REQD, "TLS is required: send NBD_OPT_STARTTLS first");
            return Step::Continue;
        }
        match opt {
            OPT_EXPORT_NAME => self.export_name(exports, data, out),
            OPT_ABORT => {
                option_reply(out, opt, REP_ACK, &[]);
                Step::Abort
            }
            OPT_LIST => {
                if !data.is_empty() {
                    error(out, opt, REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
                    return Step::Continue;
                }
                for name in exports.names() {
                    let mut payload = Vec::with_capacity(4 + name.len());
                    payload.extend_from_slice(&(name.len() as u32).to_be_bytes());
                    payload.extend_from_slice(name.as_bytes());
                    option_reply(out, opt, REP_SERVER, &payload);
                }
                option_reply(out, opt, REP_ACK, &[]);
                Step::Continue
            }
            OPT_STARTTLS => {
                if !data.is_empty() {
                    error(out, opt, REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data");
                } else if !self.tls_offered {
                    error(out, opt, REP_ERR_POLICY, "this listener does not serve TLS");
                } else if self.tls_active {
                    error(out, opt, REP_ERR_INVALID, "TLS is already active");
                } else {
                    option_reply(out, opt, REP_ACK, &[]);
                    return Step::StartTls;
                }
                Step::Continue
            }
            OPT_INFO | OPT_GO => match self.info_or_go(exports, opt, data, out) {
                Ok(step) => step,
                Err(Invalid(why)) => {
                    error(out, opt, REP_ERR_INVALID, why);
                    Step::Continue
                }
            },
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    error(out, opt, REP_ERR_INVALID, "NBD_OPT_STRUCTURED_REPLY takes no data");
                } else if self.structured {
                    error(out, opt, REP_ERR_INVALID, "structured replies are already on");
                } else {
                    self.structured = true;
                    option_reply(out, opt, REP_ACK, &[]);
                }
                Step::Continue
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                if let Err(Invalid(why)) = self.meta_context(exports, opt, data, out) {
                    error(out, opt, REP_ERR_INVALID, why);
                }
                Step::Continue
            }
            _ => {
                error(out, opt, REP_ERR_UNSUP, "option not supported");
                Step::Continue
            }
        }
    }

    fn export_name<L: ExportLookup>(
        &mut self,
        exports: &L,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Step<L::Export> {
        let Ok(name) = std::str::from_utf8(data) else {
            return Step::Close("NBD_OPT_EXPORT_NAME with a name that is not UTF-8".into());
        };
        let (name, export) = match exports.find(name) {
            Ok(found) => found,
            Err(why) => return Step::Close(format!("NBD_OPT_EXPORT_NAME: {why}")),
        };
        let info = exports.info(&export);
        out.extend_from_slice(&info.size.to_be_bytes());
        out.extend_from_slice(&info.flags.to_be_bytes());
        if !self.no_zeroes {
            out.extend_from_slice(&[0u8; 124]);
        }
        self.go(name, export)
    }

    fn go<E>(&mut self, name: String, export: E) -> Step<E> {
        // A selection holds only for the export it named (and with structured replies).
        let (allocation, bitmaps) = match &self.selected {
            Some(s) if self.structured && s.export == name => (s.allocation, s.bitmaps.clone()),
            _ => (false, Vec::new()),
        };
        Step::Go(Transmission { name, export, structured: self.structured, allocation, bitmaps })
    }

    fn info_or_go<L: ExportLookup>(
        &mut self,
        exports: &L,
        opt: u32,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Step<L::Export>, Invalid> {
        let mut d = Data(data);
        let name = d.string().ok_or(Invalid("bad export name"))?;
        let count = d.u16().ok_or(Invalid("missing information request count"))?;
        let mut wanted = Vec::with_capacity(count.min(16) as usize);
        for _ in 0..count {
            wanted.push(d.u16().ok_or(Invalid("information requests shorter than their count"))?);
        }
        if !d.is_empty() {
            return Err(Invalid("trailing bytes after the information requests"));
        }
        let (name, export) = match exports.find(name) {
            Ok(found) => found,
            Err(why) => {
                error(out, opt, REP_ERR_UNKNOWN, &why);
                return Ok(Step::Continue);
            }
        };
        let info = exports.info(&export);
        if wanted.contains(&INFO_NAME) {
            let mut p = INFO_NAME.to_be_bytes().to_vec();
            p.extend_from_slice(name.as_bytes());
            option_reply(out, opt, REP_INFO, &p);
        }
        if wanted.contains(&INFO_DESCRIPTION) {
            let mut p = INFO_DESCRIPTION.to_be_bytes().to_vec();
            p.extend_from_slice(info.description.as_bytes());
            option_reply(out, opt, REP_INFO, &p);
        }
        // Sent whether asked for or not (the protocol allows it): a client that ignores it and
        // sends unaligned requests gets EINVAL.
        let mut p = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        p.extend_from_slice(&info.min_block.to_be_bytes());
        p.extend_from_slice(&info.min_block.max(4096).to_be_bytes());
        p.extend_from_slice(&MAX_PAYLOAD.to_be_bytes());
        option_reply(out, opt, REP_INFO, &p);
        let mut p = INFO_EXPORT.to_be_bytes().to_vec();
        p.extend_from_slice(&info.size.to_be_bytes());
        p.extend_from_slice(&info.flags.to_be_bytes());
        option_reply(out, opt, REP_INFO, &p);
        option_reply(out, opt, REP_ACK, &[]);
        Ok(if opt == OPT_GO { self.go(name, export) } else { Step::Continue })
    }

    fn meta_context<L: ExportLookup>(
        &mut self,
        exports: &L,
        opt: u32,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Invalid> {
        let mut d = Data(data);
        let name = d.string().ok_or(Invalid("bad export name"))?;
        let count = d.u32().ok_or(Invalid("missing query count"))?;
        let mut queries = Vec::new();
        for _ in 0..count {
            queries.push(d.string().ok_or(Invalid("queries shorter than their count"))?);
        }
        if !d.is_empty() {
            return Err(Invalid("trailing bytes after the queries"));
        }
        if opt == OPT_SET_META_CONTEXT && !self.structured {
            return Err(Invalid("NBD_OPT_SET_META_CONTEXT needs structured replies first"));
        }
        let (name, export) = match exports.find(name) {
            Ok(found) => found,
            Err(why) => {
                error(out, opt, REP_ERR_UNKNOWN, &why);
                return Ok(());
            }
        };
        let offered = exports.info(&export).bitmaps;
        let list = opt == OPT_LIST_META_CONTEXT;
        // LIST with no query lists everything; a namespace alone ("base:", "qemu:",
        // "qemu:dirty-bitmap:") lists every context under it, and selects nothing in a SET (as
        // QEMU's server). Names the export does not serve are ignored.
        let everything = list && queries.is_empty();
        let mut allocation = everything;
        let mut chosen = vec![everything; offered.len()];
        for q in &queries {
            if *q == BASE_ALLOCATION || (list && *q == "base:") {
                allocation = true;
            } else if list && (*q == "qemu:" || *q == DIRTY_BITMAP_PREFIX) {
                chosen.iter_mut().for_each(|c| *c = true);
            } else if let Some(i) =
                q.strip_prefix(DIRTY_BITMAP_PREFIX).and_then(|n| offered.iter().position(|b| b == n))
            {
                chosen[i] = true;
            }
        }
        let reply = |out: &mut Vec<u8>, id: u32, context: &str| {
            let id = if list { 0 } else { id };
            let mut p = id.to_be_bytes().to_vec();
            p.extend_from_slice(context.as_bytes());
            option_reply(out, opt, REP_META_CONTEXT, &p);
        };
        if allocation {
            reply(out, BASE_ALLOCATION_ID, BASE_ALLOCATION);
        }
        let bitmaps: Vec<u32> = (0..offered.len() as u32).filter(|&i| chosen[i as usize]).collect();
        for &i in &bitmaps {
            reply(out, FIRST_BITMAP_ID + i, &format!("{DIRTY_BITMAP_PREFIX}{}", offered[i as usize]));
        }
        if !list {
            self.selected = Some(Selected { export: name, allocation, bitmaps });
        }
        option_reply(out, opt, REP_ACK, &[]);
        Ok(())
    }
}

/// Appends an error reply with a message for humans.
fn error(out: &mut Vec<u8>, option: u32, kind: u32, message: &str) {
    option_reply(out, option, kind, message.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Two;

    impl ExportLookup for Two {
        type Export = u64;
        fn find(&self, name: &str) -> Result<(String, u64), String> {
            match name {
                "a" => Ok(("a".into(), 1 << 20)),
                "b" => Ok(("b".into(), 2 << 20)),
                "" => Err("this listener has several exports: name one".into()),
                _ => Err(format!("no export named '{name}'")),
            }
        }
        fn names(&self) -> Vec<String> {
            vec!["a".into(), "b".into()]
        }
        fn info(&self, size: &u64) -> ExportInfo {
            let bitmaps = if *size == 1 << 20 { vec!["b0".into(), "b1".into()] } else { Vec::new() };
            ExportInfo {
                size: *size,
                flags: TFLAG_HAS_FLAGS,
                min_block: 512,
                description: "disk".into(),
                bitmaps,
            }
        }
    }

    fn hdr(option: u32, data: &[u8]) -> OptionHeader {
        OptionHeader { option, length: data.len() as u32 }
    }

    fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for i in infos {
            d.extend_from_slice(&i.to_be_bytes());
        }
        d
    }

    /// The reply types in `out`, in order.
    fn reply_types(out: &[u8]) -> Vec<u32> {
        let mut types = Vec::new();
        let mut rest = out;
        while rest.len() >= 20 {
            types.push(u32::from_be_bytes(rest[12..16].try_into().unwrap()));
            let len = u32::from_be_bytes(rest[16..20].try_into().unwrap()) as usize;
            rest = &rest[20 + len..];
        }
        types
    }

    #[test]
    fn go_answers_with_block_size_and_export_info_then_starts_transmission() {
        let mut n = Negotiation::new(false);
        n.client_flags(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).unwrap();
        let mut out = Vec::new();
        let data = go_data("b", &[INFO_NAME, INFO_BLOCK_SIZE]);
        let step = n.option(&Two, hdr(OPT_GO, &data), &data, &mut out);
        assert_eq!(
            step,
            Step::Go(Transmission {
                name: "b".into(),
                export: 2 << 20,
                structured: false,
                allocation: false,
                bitmaps: Vec::new()
            })
        );
        assert_eq!(reply_types(&out), vec![REP_INFO, REP_INFO, REP_INFO, REP_ACK]);
    }

    #[test]
    fn unknown_names_bad_data_and_unknown_options_get_error_replies() {
        let mut n = Negotiation::new(false);
        let mut out = Vec::new();
        let data = go_data("zz", &[]);
        assert_eq!(n.option(&Two, hdr(OPT_GO, &data), &data, &mut out), Step::Continue);
        let mut data = go_data("a", &[INFO_NAME]);
        data.push(0);
        assert_eq!(n.option(&Two, hdr(OPT_INFO, &data), &data, &mut out), Step::Continue);
        assert_eq!(n.option(&Two, hdr(99, &[]), &[], &mut out), Step::Continue);
        let data = go_data("", &[]);
        assert_eq!(n.option(&Two, hdr(OPT_GO, &data), &data, &mut out), Step::Continue);
        assert_eq!(reply_types(&out), vec![REP_ERR_UNKNOWN, REP_ERR_INVALID, REP_ERR_UNSUP, REP_ERR_UNKNOWN]);
    }

    #[test]
    fn meta_context_needs_structured_replies_and_follows_the_export() {
        let mut n = Negotiation::new(false);
        let mut out = Vec::new();
        let mut q = go_data("a", &[]);
        q.truncate(5); // name only
        q.extend_from_slice(&1u32.to_be_bytes());
        q.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
        q.extend_from_slice(BASE_ALLOCATION.as_bytes());
        n.option(&Two, hdr(OPT_SET_META_CONTEXT, &q), &q, &mut out);
        assert_eq!(reply_types(&out), vec![REP_ERR_INVALID]);
        out.clear();
        n.option(&Two, hdr(OPT_STRUCTURED_REPLY, &[]), &[], &mut out);
        n.option(&Two, hdr(OPT_SET_META_CONTEXT, &q), &q, &mut out);
        assert_eq!(reply_types(&out), vec![REP_ACK, REP_META_CONTEXT, REP_ACK]);
        // The selection holds for the export it named, not another.
        let data = go_data("b", &[]);
        let Step::Go(t) = n.option(&Two, hdr(OPT_GO, &data), &data, &mut out) else { panic!("no go") };
        assert!(t.structured && !t.allocation);
        let data = go_data("a", &[]);
        let Step::Go(t) = n.option(&Two, hdr(OPT_GO, &data), &data, &mut out) else { panic!("no go") };
        assert!(t.structured && t.allocation);
    }

    fn meta_data(export: &str, queries: &[&str]) -> Vec<u8> {
        let mut q = (export.len() as u32).to_be_bytes().to_vec();
        q.extend_from_slice(export.as_bytes());
        q.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for x in queries {
            q.extend_from_slice(&(x.len() as u32).to_be_bytes());
            q.extend_from_slice(x.as_bytes());
        }
        q
    }

    #[test]
    fn dirty_bitmap_contexts_are_listed_by_namespace_and_selected_per_export() {
        let mut n = Negotiation::new(false);
        let mut out = Vec::new();
        n.option(&Two, hdr(OPT_STRUCTURED_REPLY, &[]), &[], &mut out);
        out.clear();
        // "b" offers no bitmap: a qemu: query lists nothing there.
        let q = meta_data("b", &["qemu:"]);
        n.option(&Two, hdr(OPT_LIST_META_CONTEXT, &q), &q, &mut out);
        assert_eq!(reply_types(&out), vec![REP_ACK]);
        out.clear();
        let q = meta_data("a", &["qemu:dirty-bitmap:"]);
        n.option(&Two, hdr(OPT_LIST_META_CONTEXT, &q), &q, &mut out);
        assert_eq!(reply_types(&out), vec![REP_META_CONTEXT, REP_META_CONTEXT, REP_ACK]);
        let q = meta_data("a", &["qemu:dirty-bitmap:b1", "qemu:dirty-bitmap:b9", "qemu:dirty-bitmap:"]);
        n.option(&Two, hdr(OPT_SET_META_CONTEXT, &q), &q, &mut out);
        let data = go_data("b", &[]);
        let Step::Go(t) = n.option(&Two, hdr(OPT_GO, &data), &data, &mut out) else { panic!("no go") };
        assert!(!t.allocation && t.bitmaps.is_empty());
        let data = go_data("a", &[]);
        let Step::Go(t) = n.option(&Two, hdr(OPT_GO, &data), &data, &mut out) else { panic!("no go") };
        assert_eq!((t.allocation, t.bitmaps), (false, vec![1]));
        // A later SET replaces the selection.
        let q = meta_data("a", &[BASE_ALLOCATION]);
        n.option(&Two, hdr(OPT_SET_META_CONTEXT, &q), &q, &mut out);
        let Step::Go(t) = n.option(&Two, hdr(OPT_GO, &data), &data, &mut out) else { panic!("no go") };
        assert_eq!((t.allocation, t.bitmaps), (true, vec![]));
    }

    #[test]
    fn a_tls_listener_refuses_everything_but_starttls_until_it_runs() {
        let mut n = Negotiation::new(true);
        let mut out = Vec::new();
        let data = go_data("a", &[]);
        assert_eq!(n.option(&Two, hdr(OPT_GO, &data), &data, &mut out), Step::Continue);
        assert_eq!(reply_types(&out), vec![REP_ERR_TLS_REQD]);
        assert!(matches!(n.option(&Two, hdr(OPT_EXPORT_NAME, b"a"), b"a", &mut out), Step::Close(_)));
        out.clear();
        assert_eq!(n.option(&Two, hdr(OPT_STARTTLS, &[]), &[], &mut out), Step::StartTls);
        n.tls_started();
        assert_eq!(n.option(&Two, hdr(OPT_STARTTLS, &[]), &[], &mut out), Step::Continue);
        assert!(matches!(n.option(&Two, hdr(OPT_GO, &data), &data, &mut out), Step::Go(_)));
        assert_eq!(reply_types(&out)[..2], [REP_ACK, REP_ERR_INVALID]);
    }

    #[test]
    fn floods_and_huge_options_close_the_connection() {
        let mut n = Negotiation::new(false);
        assert!(n.check_header(&OptionHeader { option: OPT_LIST, length: MAX_OPTION_LEN + 1 }).is_err());
        let mut n = Negotiation::new(false);
        for _ in 0..MAX_OPTIONS {
            n.check_header(&OptionHeader { option: OPT_LIST, length: 0 }).unwrap();
        }
        assert!(n.check_header(&OptionHeader { option: OPT_LIST, length: 0 }).is_err());
        assert!(Negotiation::new(false).client_flags(0).is_err());
        assert!(Negotiation::new(false).client_flags(0x10 | CLIENT_FLAG_FIXED_NEWSTYLE).is_err());
    }

    #[test]
    fn export_name_answers_with_size_and_flags_and_zero_padding_unless_refused() {
        let mut n = Negotiation::new(false);
        n.client_flags(CLIENT_FLAG_FIXED_NEWSTYLE).unwrap();
        let mut out = Vec::new();
        assert!(matches!(n.option(&Two, hdr(OPT_EXPORT_NAME, b"a"), b"a", &mut out), Step::Go(_)));
        assert_eq!(out.len(), 8 + 2 + 124);
        assert_eq!(u64::from_be_bytes(out[..8].try_into().unwrap()), 1 << 20);
        assert!(matches!(n.option(&Two, hdr(OPT_EXPORT_NAME, b"q"), b"q", &mut out), Step::Close(_)));
    }
}
