//! No import circles between a crate's source files, nor between the bench's Python modules, and
//! no source file over [`MAX_CODE_LINES`] lines of code.
//!
//! A circle (a strongly connected component of the graph of files joined by the paths they name)
//! means two files cannot be read, tested or moved one without the other; most come from a plain
//! type living in the upper file, and go away by moving it down into the lower file or a new
//! small one both import. Test-only code does not count: a test module importing its parent is
//! how tests are written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::python_source;
use super::rust_source::{circles, ModuleTree};

/// Import circles still to remove, each as its files (relative to the workspace, sorted). This
/// list only shrinks: a circle found that is not here fails the test, and so does an entry that
/// is no longer found (delete it).
const KNOWN_RUST_CIRCLES: &[&[&str]] = &[];

/// The bench's Python import circles still to remove, as module names (sorted); only shrinks.
const KNOWN_PYTHON_CIRCLES: &[&[&str]] = &[];

/// Lines of code (blank, comment and test-only lines not counted) a non-test source file may hold.
const MAX_CODE_LINES: usize = 800;

/// Files over [`MAX_CODE_LINES`] still to split by role. Only shrinks: a listed file that fits
/// fails the test until its entry is deleted.
const OVERSIZED: &[&str] = &[];

pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the workspace root")
}

/// Every crate target's root file (library, binaries) of every workspace member.
pub(crate) fn crate_roots(root: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(root.join("Cargo.toml")).expect("the workspace manifest");
    let manifest: toml::Table = text.parse().expect("the workspace manifest parses");
    let members = manifest["workspace"]["members"].as_array().expect("[workspace] members");
    let mut roots = Vec::new();
    for member in members {
        let dir = root.join(member.as_str().expect("a member path"));
        let text = std::fs::read_to_string(dir.join("Cargo.toml")).expect("a member manifest");
        let manifest: toml::Table = text.parse().expect("a member manifest parses");
        let mut found: BTreeSet<PathBuf> = BTreeSet::new();
        for default in ["src/lib.rs", "src/main.rs"] {
            found.insert(dir.join(default));
        }
        if let Ok(bins) = std::fs::read_dir(dir.join("src/bin")) {
            found.extend(
                bins.map(|e| e.expect("a bin entry").path())
                    .filter(|p| p.extension().is_some_and(|e| e == "rs")),
            );
        }
        let declared = manifest
            .get("lib")
            .into_iter()
            .chain(manifest.get("bin").and_then(|b| b.as_array()).into_iter().flatten());
        found.extend(declared.filter_map(|t| t.get("path")).filter_map(|p| p.as_str()).map(|p| dir.join(p)));
        roots.extend(found.into_iter().filter(|p| p.exists()));
    }
    roots
}

pub(crate) fn relative(root: &Path, file: &Path) -> String {
    file.strip_prefix(root).unwrap_or(file).display().to_string()
}

/// Every circle found and the edges inside it, as text a reader can act on.
fn describe<N: Ord + Clone + std::fmt::Display>(
    scc: &[N],
    edges: &BTreeMap<(N, N), (usize, String)>,
) -> String {
    let mut text = scc.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" ⇄ ");
    for ((a, b), (line, path)) in edges {
        if scc.contains(a) && scc.contains(b) {
            text.push_str(&format!("\n    {a}:{line} names {path} (in {b})"));
        }
    }
    text
}

/// Compares the circles found with the known list; the error names what changed.
fn check_known(found: Vec<(Vec<String>, String)>, known: &[&[&str]], what: &str) -> Result<(), String> {
    let mut errors = Vec::new();
    let known: Vec<Vec<String>> = known.iter().map(|c| c.iter().map(|s| s.to_string()).collect()).collect();
    for (files, text) in &found {
        if !known.contains(files) {
            errors.push(format!("a {what} import circle:\n  {text}"));
        }
    }
    for k in &known {
        if !found.iter().any(|(files, _)| files == k) {
            errors.push(format!(
                "{k:?} is listed as a {what} circle still to remove but is no longer found: delete its entry"
            ));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

#[test]
fn no_import_circle_between_a_crates_source_files() {
    let root = workspace();
    let roots = crate_roots(&root);
    assert!(roots.len() >= 16, "found only {roots:?}");
    let mut found = Vec::new();
    let mut files_seen = 0;
    for crate_root in roots {
        let tree = ModuleTree::load(&crate_root);
        files_seen += tree.files.len();
        let names: Vec<String> = tree.files.iter().map(|f| relative(&root, f)).collect();
        let edges = tree.edges();
        let named: BTreeMap<(String, String), (usize, String)> =
            edges.iter().map(|((a, b), v)| ((names[*a].clone(), names[*b].clone()), v.clone())).collect();
        let pairs: BTreeSet<(usize, usize)> = edges.keys().copied().collect();
        for scc in circles(names.len(), &pairs) {
            let mut files: Vec<String> = scc.iter().map(|&n| names[n].clone()).collect();
            files.sort();
            let text = describe(&files, &named);
            found.push((files, text));
        }
    }
    // The walk means something only if it reached the workspace's modules.
    assert!(files_seen > 200, "the module walk reached only {files_seen} files");
    if let Err(e) = check_known(found, KNOWN_RUST_CIRCLES, "Rust") {
        panic!(
            "{e}\nMove the plain type both files need down, into the lower file or a new one both import."
        );
    }
}

#[test]
fn no_import_circle_between_the_benchs_python_modules() {
    let bench = workspace().join("bench");
    let modules = python_source::modules(&bench);
    for expected in ["bench", "fpbench.report", "fpbench.sections.raid"] {
        assert!(modules.contains_key(expected), "{expected} is not among {:?}", modules.keys());
    }
    let names: Vec<String> = modules.keys().cloned().collect();
    let edges = python_source::edges(&modules);
    assert!(
        edges.contains_key(&("bench".to_string(), "fpbench.report".to_string())),
        "bench.py imports fpbench.report, yet no edge was found: {:?}",
        edges.keys()
    );
    let index = |n: &String| names.iter().position(|m| m == n).expect("a module");
    let pairs: BTreeSet<(usize, usize)> = edges.keys().map(|(a, b)| (index(a), index(b))).collect();
    let found = circles(names.len(), &pairs)
        .into_iter()
        .map(|scc| {
            let modules: Vec<String> = scc.iter().map(|&n| names[n].clone()).collect();
            let text = describe(&modules, &edges);
            (modules, text)
        })
        .collect();
    if let Err(e) = check_known(found, KNOWN_PYTHON_CIRCLES, "Python") {
        panic!(
            "{e}\nMove what both modules need into a module below both (no function-local import hides it)."
        );
    }
}

#[test]
fn no_source_file_over_the_code_line_limit() {
    let root = workspace();
    let mut over = BTreeMap::new();
    for crate_root in crate_roots(&root) {
        let tree = ModuleTree::load(&crate_root);
        for (file, lines) in tree.files.iter().zip(&tree.code_lines) {
            if *lines > MAX_CODE_LINES {
                over.insert(relative(&root, file), *lines);
            }
        }
    }
    let mut errors = Vec::new();
    for (file, lines) in &over {
        if !OVERSIZED.contains(&file.as_str()) {
            errors.push(format!(
                "{file} holds {lines} lines of code (at most {MAX_CODE_LINES}): split it by role"
            ));
        }
    }
    for file in OVERSIZED {
        if !over.contains_key(*file) {
            errors.push(format!(
                "{file} fits in {MAX_CODE_LINES} lines of code now: delete its OVERSIZED entry"
            ));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// The scanner on a small crate: a parent ⇄ child circle through `super::` and a re-export,
/// a test module's import of its parent left out, strings and comments ignored.
#[test]
fn the_scanner_finds_a_circle_and_skips_test_code() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("up")).expect("src/up");
    let write = |name: &str, text: &str| std::fs::write(src.join(name), text).expect("a source file");
    write("lib.rs", "mod up;\nmod low;\npub use up::Plain;\n// crate::low::Gone in a comment\n");
    write("up/mod.rs", "mod child;\npub struct Plain;\nfn f() { child::run() }\n");
    write("up/child.rs", "pub fn run() { let _ = super::Plain; let _ = \"crate::low::x\"; }\n");
    write(
        "low.rs",
        "pub fn helper() {}\n#[cfg(test)]\nmod checks { use crate::Plain; }\nmod tests { use crate::up::Plain; }\n\n\n",
    );
    let tree = ModuleTree::load(&src.join("lib.rs"));
    let name = |n: usize| relative(&src, &tree.files[n]);
    let pairs: BTreeSet<(usize, usize)> = tree.edges().keys().copied().collect();
    let found: Vec<Vec<String>> =
        circles(tree.files.len(), &pairs).iter().map(|c| c.iter().map(|&n| name(n)).collect()).collect();
    assert_eq!(found.len(), 1, "{found:?}");
    let mut circle = found[0].clone();
    circle.sort();
    assert_eq!(circle, ["up/child.rs", "up/mod.rs"]);
    let low = tree.files.iter().position(|f| f.ends_with("low.rs")).expect("low.rs walked");
    assert!(pairs.iter().all(|&(from, to)| from != low && to != low), "{pairs:?}");
    assert_eq!(tree.code_lines[low], 1, "low.rs: one line of non-test code");
}

/// The Python scanner: a function-local import is an import, one in a docstring is not.
#[test]
fn the_python_scanner_sees_function_local_imports() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let pkg = dir.path().join("pkg");
    std::fs::create_dir_all(&pkg).expect("pkg/");
    let write = |name: &str, text: &str| std::fs::write(pkg.join(name), text).expect("a module");
    write("__init__.py", "");
    write("a.py", "from pkg.b import g\n\ndef f():\n    return g()\n");
    write("b.py", "def g():\n    \"\"\"\nfrom pkg.c import h\n\"\"\"\n    from . import a\n    return a\n");
    write("c.py", "import pkg.a  # from pkg.b import g\n");
    let modules = python_source::modules(dir.path());
    let edges: BTreeSet<(String, String)> = python_source::edges(&modules).into_keys().collect();
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    let expected: BTreeSet<_> =
        [pair("pkg.a", "pkg.b"), pair("pkg.b", "pkg.a"), pair("pkg.c", "pkg.a")].into();
    assert_eq!(edges, expected);
}
