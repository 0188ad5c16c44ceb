//! Plain system calls (waiting, socket receives and sends, pipes, eventfds, the current CPU) go
//! through fp-sys's safe wrappers: no crate's non-test code calls them through `libc` itself,
//! so their `unsafe` and its `// SAFETY:` stay in one crate.

use std::collections::BTreeSet;

use super::circles::{crate_roots, relative, workspace};
use super::rust_source::{lex, non_test, ModuleTree, Tok};

/// The calls fp-sys wraps.
const WRAPPED: [&str; 11] = [
    "poll",
    "recv",
    "recvmsg",
    "readv",
    "send",
    "sendmsg",
    "writev",
    "pipe",
    "pipe2",
    "sched_getcpu",
    "eventfd",
];

/// Files that still make one of those calls themselves, to move onto fp-sys. Only shrinks: a
/// listed file that no longer makes one fails the test until its entry is deleted.
const KNOWN: &[&str] = &[];

/// `libc::NAME(` for each wrapped NAME in `tokens`.
fn raw_calls(tokens: &[super::rust_source::Token]) -> Vec<(usize, String)> {
    tokens
        .windows(4)
        .filter_map(|w| match (&w[0].tok, &w[1].tok, &w[2].tok, &w[3].tok) {
            (Tok::Ident(l), Tok::PathSep, Tok::Ident(f), Tok::Punct('('))
                if l == "libc" && WRAPPED.contains(&f.as_str()) =>
            {
                Some((w[0].line, f.clone()))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn plain_system_calls_go_through_fp_sys() {
    let root = workspace();
    let mut found = BTreeSet::new();
    let mut errors = Vec::new();
    for crate_root in crate_roots(&root) {
        if relative(&root, &crate_root).starts_with("crates/sys/") {
            continue;
        }
        for file in ModuleTree::load(&crate_root).files {
            let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let calls = raw_calls(&non_test(&lex(&text)));
            let name = relative(&root, &file);
            if calls.is_empty() {
                continue;
            }
            if !KNOWN.contains(&name.as_str()) {
                let list: Vec<String> =
                    calls.iter().map(|(line, f)| format!("libc::{f} at line {line}")).collect();
                errors.push(format!("{name} calls {}: use (or add) the fp-sys wrapper", list.join(", ")));
            }
            found.insert(name);
        }
    }
    for file in KNOWN {
        if !found.contains(*file) {
            errors.push(format!("{file} makes no plain system call of its own now: delete its KNOWN entry"));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// The scanner sees a call, and not a test's, a comment's or a path that is no call.
#[test]
fn the_scanner_sees_raw_calls_outside_tests_only() {
    let src = "fn f() { unsafe { libc::poll(p, 1, 0) }; let _ = libc::POLLIN; }\n\
               // libc::recv(\n\
               #[cfg(test)]\nmod t { fn g() { unsafe { libc::pipe(x) }; } }\n";
    let calls = raw_calls(&non_test(&lex(src)));
    assert_eq!(calls, [(1, "poll".to_string())]);
}
