//! The import graph of the bench's Python: every `import`/`from … import` statement at any
//! level (a function-local import is an import too), strings and comments left out.

use std::collections::BTreeMap;
use std::path::Path;

/// `src` with comments and the insides of strings blanked, lines kept.
fn code_only(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '#' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '"' || ch == '\'' {
            let triple = at(i + 1) == ch && at(i + 2) == ch;
            let quote_len = if triple { 3 } else { 1 };
            out.push_str("\"\"");
            i += quote_len;
            while i < c.len() {
                if c[i] == '\\' {
                    i += 2;
                    continue;
                }
                if c[i] == ch && (!triple || (at(i + 1) == ch && at(i + 2) == ch)) {
                    i += quote_len;
                    break;
                }
                if c[i] == '\n' {
                    if !triple {
                        break;
                    }
                    out.push('\n');
                }
                i += 1;
            }
        } else {
            out.push(ch);
            i += 1;
        }
    }
    out
}

/// Statements (continuation lines joined) with the line each starts on.
fn statements(code: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut start = 0;
    let mut depth = 0i32;
    for (n, line) in code.lines().enumerate() {
        if current.is_empty() {
            start = n + 1;
        }
        let continued = line.trim_end().ends_with('\\');
        current.push(' ');
        current.push_str(line.trim_end().trim_end_matches('\\'));
        depth += line
            .chars()
            .map(|c| i32::from(matches!(c, '(' | '[' | '{')) - i32::from(matches!(c, ')' | ']' | '}')))
            .sum::<i32>();
        if depth <= 0 && !continued {
            for part in current.split(';') {
                out.push((start, part.trim().to_string()));
            }
            current.clear();
            depth = 0;
        }
    }
    out
}

/// The bench's Python modules by dotted name (`fpbench.report`, `bench`) → file.
pub fn modules(bench: &Path) -> BTreeMap<String, std::path::PathBuf> {
    let mut out = BTreeMap::new();
    let mut todo = vec![bench.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                if path.join("__init__.py").exists() {
                    todo.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "py") {
                continue;
            }
            let rel = path.strip_prefix(bench).expect("under bench/").with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|p| p == "__init__") {
                parts.pop();
            }
            out.insert(parts.join("."), path);
        }
    }
    out
}

/// Import edges between the bench's modules: (from, to) → the first line that makes it.
pub fn edges(modules: &BTreeMap<String, std::path::PathBuf>) -> BTreeMap<(String, String), (usize, String)> {
    let mut edges = BTreeMap::new();
    for (name, file) in modules {
        let src = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let is_package = file.file_stem().is_some_and(|s| s == "__init__");
        let package: Vec<&str> = {
            let mut p: Vec<&str> = name.split('.').collect();
            if !is_package {
                p.pop();
            }
            p
        };
        // The deepest of our modules a dotted name leads into.
        let ours = |dotted: &str| -> Option<String> {
            let parts: Vec<&str> = dotted.split('.').collect();
            (1..=parts.len()).rev().map(|n| parts[..n].join(".")).find(|m| modules.contains_key(m))
        };
        for (line, stmt) in statements(&code_only(&src)) {
            let mut targets = Vec::new();
            if let Some(rest) = stmt.strip_prefix("import ") {
                for item in rest.split(',') {
                    let module = item.split_whitespace().next().unwrap_or("");
                    targets.extend(ours(module));
                }
            } else if let Some(rest) = stmt.strip_prefix("from ") {
                let Some((from, names)) = rest.split_once(" import ") else { continue };
                let from = from.trim();
                let level = from.chars().take_while(|&c| c == '.').count();
                let base = if level == 0 {
                    from.to_string()
                } else {
                    let keep = package.len().saturating_sub(level - 1);
                    let mut parts: Vec<&str> = package[..keep].to_vec();
                    let tail = &from[level..];
                    if !tail.is_empty() {
                        parts.push(tail);
                    }
                    parts.join(".")
                };
                let names = names.replace(['(', ')'], " ");
                for item in names.split(',') {
                    let Some(imported) = item.split_whitespace().next() else { continue };
                    let full =
                        if base.is_empty() { imported.to_string() } else { format!("{base}.{imported}") };
                    if modules.contains_key(&full) {
                        targets.push(full);
                    } else if !base.is_empty() {
                        targets.extend(ours(&base));
                    }
                }
            }
            for to in targets {
                if &to != name {
                    edges.entry((name.clone(), to)).or_insert_with(|| (line, stmt.clone()));
                }
            }
        }
    }
    edges
}
