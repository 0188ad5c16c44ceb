//! Just enough of Rust's lexical and module structure to draw a crate's import graph: the
//! module tree (`mod` declarations from the crate root), every path a file names
//! (`use` trees and inline `crate::…`/`super::…`/`self::…`/`child::…` paths), and where a
//! re-exported name really lives. Test-only code (`#[cfg(test)]` items, `mod tests`, `#[test]`)
//! is left out, so a test module importing its parent is no circle.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
    Str(String),
    /// Numbers, chars and lifetimes: none of them takes part in a path.
    Other,
}

#[derive(Clone, Debug)]
pub struct Token {
    pub tok: Tok,
    pub line: usize,
    pub end_line: usize,
}

impl Token {
    fn is(&self, c: char) -> bool {
        self.tok == Tok::Punct(c)
    }
    fn ident(&self) -> Option<&str> {
        match &self.tok {
            Tok::Ident(s) => Some(s),
            _ => None,
        }
    }
    fn is_ident(&self, s: &str) -> bool {
        self.ident() == Some(s)
    }
}

/// Tokens of `src` without comments. Strings keep their raw text (for `#[path = "…"]`).
pub fn lex(src: &str) -> Vec<Token> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let start_line = line;
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if ch == '"' {
            let begin = i + 1;
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    line += usize::from(at(i + 1) == '\n');
                    i += 1;
                }
                line += usize::from(at(i) == '\n');
                i += 1;
            }
            let text: String = c[begin..i.min(c.len())].iter().collect();
            i += 1;
            out.push(Token { tok: Tok::Str(text), line: start_line, end_line: line });
        } else if ch == '\'' {
            if at(i + 1) == '\\' {
                // An escaped char literal: '\n', '\'', '\u{..}'.
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                // A lifetime or label.
                i += 1;
                while at(i).is_alphanumeric() || at(i) == '_' {
                    i += 1;
                }
            }
            out.push(Token { tok: Tok::Other, line: start_line, end_line: line });
        } else if ch.is_alphabetic() || ch == '_' {
            let begin = i;
            while at(i).is_alphanumeric() || at(i) == '_' {
                i += 1;
            }
            let word: String = c[begin..i].iter().collect();
            let raw_prefix = matches!(word.as_str(), "r" | "br" | "cr");
            if raw_prefix && (at(i) == '"' || (at(i) == '#' && matches!(at(i + 1), '"' | '#'))) {
                let mut hashes = 0;
                while at(i) == '#' {
                    hashes += 1;
                    i += 1;
                }
                i += 1; // the opening quote
                let begin = i;
                loop {
                    if i >= c.len() {
                        break;
                    }
                    if c[i] == '"' && (1..=hashes).all(|h| at(i + h) == '#') {
                        break;
                    }
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
                let text: String = c[begin..i.min(c.len())].iter().collect();
                i += 1 + hashes;
                out.push(Token { tok: Tok::Str(text), line: start_line, end_line: line });
            } else if matches!(word.as_str(), "b" | "c") && matches!(at(i), '"' | '\'') {
                // b"…", c"…", b'…': lexed by the next round as a string or char.
                continue;
            } else if word == "r" && at(i) == '#' {
                // A raw identifier: r#type.
                let begin = i + 1;
                i += 1;
                while at(i).is_alphanumeric() || at(i) == '_' {
                    i += 1;
                }
                out.push(Token { tok: Tok::Ident(c[begin..i].iter().collect()), line, end_line: line });
            } else {
                out.push(Token { tok: Tok::Ident(word), line, end_line: line });
            }
        } else if ch.is_ascii_digit() {
            while at(i).is_alphanumeric() || at(i) == '_' || (at(i) == '.' && at(i + 1).is_ascii_digit()) {
                i += 1;
            }
            out.push(Token { tok: Tok::Other, line, end_line: line });
        } else if ch == ':' && at(i + 1) == ':' {
            i += 2;
            out.push(Token { tok: Tok::PathSep, line, end_line: line });
        } else {
            i += 1;
            out.push(Token { tok: Tok::Punct(ch), line, end_line: line });
        }
    }
    out
}

/// The index after the bracketed group opening at `i` (`(`, `[` or `{`).
fn skip_group(t: &[Token], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < t.len() {
        match t[i].tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// The index after the item, statement, field or match arm starting at `i`: its `;` or `,`,
/// or its closing brace, or (without consuming it) the closer of what encloses it.
fn skip_item(t: &[Token], mut i: usize) -> usize {
    while i < t.len() {
        match t[i].tok {
            Tok::Punct(';' | ',') => return i + 1,
            Tok::Punct(')' | ']' | '}') => return i,
            Tok::Punct('{') => {
                i = skip_group(t, i);
                if t.get(i).is_some_and(|n| n.is(',') || n.is(';')) {
                    i += 1;
                }
                return i;
            }
            Tok::Punct('(' | '[') => i = skip_group(t, i),
            _ => i += 1,
        }
    }
    i
}

/// Whether the attribute at `i` (`#[…]`) makes what follows test-only.
fn test_only_attribute(t: &[Token], i: usize) -> bool {
    let words: Vec<&str> = t[i..].iter().take(6).map(|k| k.ident().unwrap_or("")).collect();
    let puncts = |k: usize, c: char| t.get(i + k).is_some_and(|x| x.is(c));
    if !(puncts(0, '#') && puncts(1, '[')) {
        return false;
    }
    // #[test], #[cfg(test)], #[cfg(all(test, …))]
    (words.get(2) == Some(&"test") && puncts(3, ']'))
        || (words.get(2) == Some(&"cfg") && puncts(3, '(') && words.get(4) == Some(&"test") && puncts(5, ')'))
        || (words.get(2) == Some(&"cfg")
            && puncts(3, '(')
            && words.get(4) == Some(&"all")
            && puncts(5, '(')
            && t.get(i + 6).is_some_and(|x| x.is_ident("test")))
}

/// The tokens of non-test code: `#[cfg(test)]`/`#[test]` items and `mod tests` left out.
/// A file whose first attribute is `#![cfg(test)]` yields nothing.
pub fn non_test(t: &[Token]) -> Vec<Token> {
    if t.len() > 6
        && t[0].is('#')
        && t[1].is('!')
        && t[2].is('[')
        && t[3].is_ident("cfg")
        && t[5].is_ident("test")
    {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if test_only_attribute(t, i) {
            i = skip_group(t, i + 1);
            // Further attributes of the same item.
            while t.get(i).is_some_and(|k| k.is('#')) && t.get(i + 1).is_some_and(|k| k.is('[')) {
                i = skip_group(t, i + 1);
            }
            i = skip_item(t, i);
        } else if t[i].is_ident("mod") && t.get(i + 1).is_some_and(|k| k.is_ident("tests")) {
            i = skip_item(t, i);
        } else {
            out.push(t[i].clone());
            i += 1;
        }
    }
    out
}

/// Lines holding non-test code.
pub fn code_lines(tokens: &[Token]) -> usize {
    let lines: BTreeSet<usize> = tokens.iter().flat_map(|t| t.line..=t.end_line).collect();
    lines.len()
}

/// One path of a `use` tree, flattened.
#[derive(Clone, Debug)]
pub struct UsePath {
    pub segments: Vec<String>,
    pub glob: bool,
    /// The name it binds (its `as` alias or last segment); none for a glob.
    pub name: Option<String>,
}

/// A path a file names, in the module it names it from.
#[derive(Clone, Debug)]
pub struct PathRef {
    pub module: Vec<String>,
    pub path: UsePath,
    pub line: usize,
    /// `pub use`/`pub(crate) use`: a facade, a dependency only where the file itself uses it.
    pub reexport: bool,
}

/// What one source file declares and names.
#[derive(Debug, Default)]
pub struct FileSyntax {
    /// Child modules declared with `mod name;`: (module path, `#[path]` if any).
    pub child_files: Vec<(Vec<String>, Option<String>)>,
    /// Modules declared inline (`mod name { … }`).
    pub inline_modules: Vec<Vec<String>>,
    pub paths: Vec<PathRef>,
    /// Names of items defined, by module.
    pub items: HashMap<Vec<String>, BTreeSet<String>>,
    /// How often each identifier occurs outside `use` statements.
    pub idents: HashMap<String, usize>,
}

fn use_tree(t: &[Token], i: &mut usize, prefix: Vec<String>, out: &mut Vec<UsePath>) {
    let mut path = prefix;
    loop {
        match t.get(*i).map(|k| &k.tok) {
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                *i += 1;
                if t.get(*i).is_some_and(|k| k.tok == Tok::PathSep) {
                    *i += 1;
                    continue;
                }
                break;
            }
            Some(Tok::PathSep) => *i += 1,
            Some(Tok::Punct('{')) => {
                *i += 1;
                while *i < t.len() && !t[*i].is('}') {
                    use_tree(t, i, path.clone(), out);
                    if t.get(*i).is_some_and(|k| k.is(',')) {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                out.push(UsePath { segments: path, glob: true, name: None });
                return;
            }
            _ => break,
        }
    }
    if path.len() > 1 && path.last().is_some_and(|s| s == "self") {
        path.pop();
    }
    let mut name = path.last().cloned();
    if t.get(*i).is_some_and(|k| k.is_ident("as")) {
        name = t.get(*i + 1).and_then(|k| k.ident()).map(str::to_string);
        *i += 2;
    }
    out.push(UsePath { segments: path, glob: false, name });
}

const ITEM_KEYWORDS: [&str; 9] =
    ["fn", "struct", "enum", "trait", "type", "const", "static", "union", "macro_rules"];

/// Declarations and paths of a file whose module path is `module`, from its non-test tokens.
pub fn parse(t: &[Token], module: &[String]) -> FileSyntax {
    let mut syn = FileSyntax::default();
    // Inline modules open: (module path, brace depth inside it).
    let mut stack: Vec<(Vec<String>, usize)> = vec![(module.to_vec(), 0)];
    let mut depth = 0usize;
    let mut pending_path: Option<String> = None;
    let mut i = 0;
    while i < t.len() {
        let here = stack.last().expect("the file's own module").0.clone();
        match &t[i].tok {
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                if stack.len() > 1 && stack.last().is_some_and(|(_, d)| *d == depth) {
                    stack.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Punct('#') if t.get(i + 1).is_some_and(|k| k.is('[')) => {
                if t.get(i + 2).is_some_and(|k| k.is_ident("path")) {
                    if let Some(Tok::Str(s)) = t.get(i + 4).map(|k| &k.tok) {
                        pending_path = Some(s.clone());
                    }
                }
                i = skip_group(t, i + 1);
            }
            Tok::Ident(w) if w == "mod" => {
                let Some(name) = t.get(i + 1).and_then(|k| k.ident()) else {
                    i += 1;
                    continue;
                };
                let mut child = here.clone();
                child.push(name.to_string());
                if t.get(i + 2).is_some_and(|k| k.is(';')) {
                    syn.child_files.push((child, pending_path.take()));
                    i += 3;
                } else {
                    syn.inline_modules.push(child.clone());
                    depth += 1;
                    stack.push((child, depth));
                    i += 3;
                }
            }
            Tok::Ident(w) if w == "use" && !t.get(i + 1).is_some_and(|k| k.is('<')) => {
                let reexport = t[..i].last().is_some_and(|k| k.is_ident("pub"))
                    || (t[..i].last().is_some_and(|k| k.is(')'))
                        && t[..i].iter().rev().take(6).any(|k| k.is_ident("pub")));
                let line = t[i].line;
                let mut j = i + 1;
                let mut uses = Vec::new();
                use_tree(t, &mut j, Vec::new(), &mut uses);
                for path in uses {
                    syn.paths.push(PathRef { module: here.clone(), path, line, reexport });
                }
                i = j;
            }
            Tok::Ident(w) if ITEM_KEYWORDS.contains(&w.as_str()) => {
                let mut k = i + 1;
                if t.get(k).is_some_and(|x| x.is('!')) {
                    k += 1;
                }
                if let Some(name) = t.get(k).and_then(|x| x.ident()) {
                    if !ITEM_KEYWORDS.contains(&name) {
                        syn.items.entry(here.clone()).or_default().insert(name.to_string());
                    }
                }
                *syn.idents.entry(w.clone()).or_default() += 1;
                i += 1;
            }
            Tok::Ident(first) => {
                *syn.idents.entry(first.clone()).or_default() += 1;
                let after_sep = i > 0 && t[i - 1].tok == Tok::PathSep;
                if !after_sep && t.get(i + 1).is_some_and(|k| k.tok == Tok::PathSep) {
                    let mut segments = vec![first.clone()];
                    let mut j = i + 1;
                    while t.get(j).is_some_and(|k| k.tok == Tok::PathSep) {
                        let Some(s) = t.get(j + 1).and_then(|k| k.ident()) else { break };
                        segments.push(s.to_string());
                        *syn.idents.entry(s.to_string()).or_default() += 1;
                        j += 2;
                    }
                    if segments.len() > 1 {
                        let name = segments.last().cloned();
                        let path = UsePath { segments, glob: false, name };
                        syn.paths.push(PathRef {
                            module: here.clone(),
                            path,
                            line: t[i].line,
                            reexport: false,
                        });
                    }
                    i = j;
                } else {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    syn
}

/// One crate target's module tree: which file holds each module, and what each file names.
pub struct ModuleTree {
    pub files: Vec<PathBuf>,
    pub syntax: Vec<FileSyntax>,
    pub code_lines: Vec<usize>,
    /// Module path → index of the file that holds it.
    pub modules: BTreeMap<Vec<String>, usize>,
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

impl ModuleTree {
    /// Walks the non-test modules reachable from the crate root file `root`.
    pub fn load(root: &Path) -> ModuleTree {
        let mut tree = ModuleTree {
            files: Vec::new(),
            syntax: Vec::new(),
            code_lines: Vec::new(),
            modules: BTreeMap::new(),
        };
        let mut todo = vec![(root.to_path_buf(), Vec::<String>::new())];
        while let Some((file, module)) = todo.pop() {
            let tokens = non_test(&lex(&read(&file)));
            let syn = parse(&tokens, &module);
            let index = tree.files.len();
            tree.modules.insert(module.clone(), index);
            for inline in &syn.inline_modules {
                tree.modules.insert(inline.clone(), index);
            }
            // A root or mod.rs holds its children beside it; foo.rs holds them in foo/.
            let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            let dir = file.parent().expect("a file's directory");
            let child_dir =
                if module.is_empty() || stem == "mod" { dir.to_path_buf() } else { dir.join(stem) };
            for (child, path_attr) in &syn.child_files {
                // Children of an inline module live in a folder named after it.
                let nested = &child[module.len()..child.len() - 1];
                let base = nested.iter().fold(child_dir.clone(), |d, m| d.join(m));
                let name = child.last().expect("a child module's name");
                let found = match path_attr {
                    Some(p) => vec![dir.join(p)],
                    None => vec![base.join(format!("{name}.rs")), base.join(name).join("mod.rs")],
                };
                let path = found.iter().find(|p| p.exists()).unwrap_or_else(|| {
                    panic!("{}: `mod {name};` found in none of {found:?}", file.display())
                });
                todo.push((path.clone(), child.clone()));
            }
            tree.files.push(file);
            tree.code_lines.push(code_lines(&tokens));
            tree.syntax.push(syn);
        }
        tree
    }

    fn is_module(&self, m: &[String]) -> bool {
        self.modules.contains_key(m)
    }

    /// The module a path starts from and the segments left, if it names this crate.
    fn start(&self, from: &[String], segments: &[String]) -> Option<(Vec<String>, usize)> {
        let first = segments.first()?.as_str();
        match first {
            "crate" => Some((Vec::new(), 1)),
            "self" => Some((from.to_vec(), 1)),
            "super" => {
                let mut m = from.to_vec();
                let mut k = 0;
                while segments.get(k).is_some_and(|s| s == "super") {
                    m.pop()?;
                    k += 1;
                }
                Some((m, k))
            }
            _ => {
                let mut child = from.to_vec();
                child.push(first.to_string());
                self.is_module(&child).then_some((child, 1))
            }
        }
    }

    /// The deepest module a path names, and the item name after it if any.
    fn module_of(&self, from: &[String], segments: &[String]) -> Option<(Vec<String>, Option<String>)> {
        let (mut m, mut k) = self.start(from, segments)?;
        while let Some(s) = segments.get(k) {
            let mut deeper = m.clone();
            deeper.push(s.clone());
            if !self.is_module(&deeper) {
                break;
            }
            m = deeper;
            k += 1;
        }
        Some((m, segments.get(k).cloned()))
    }

    /// The file that defines `name` as seen in module `m`, following re-exports.
    fn item_file(&self, m: &[String], name: &str, hops: usize) -> Option<usize> {
        let file = *self.modules.get(m)?;
        if hops > 8 {
            return Some(file);
        }
        let syn = &self.syntax[file];
        if syn.items.get(m).is_some_and(|names| names.contains(name)) {
            return Some(file);
        }
        let here = syn.paths.iter().filter(|p| p.module == m && p.reexport);
        for p in here.clone().filter(|p| !p.path.glob && p.path.name.as_deref() == Some(name)) {
            if let Some(target) = self.resolve(&p.module, &p.path.segments, hops + 1) {
                return Some(target);
            }
        }
        for p in here.filter(|p| p.path.glob) {
            if let Some((target, None)) = self.module_of(&p.module, &p.path.segments) {
                if let Some(f) = self.item_file(&target, name, hops + 1) {
                    if f != file {
                        return Some(f);
                    }
                }
            }
        }
        Some(file)
    }

    /// The file a path (named from module `from`) leads to, or none if it leaves the crate.
    fn resolve(&self, from: &[String], segments: &[String], hops: usize) -> Option<usize> {
        let (m, item) = self.module_of(from, segments)?;
        match item {
            Some(name) => self.item_file(&m, &name, hops),
            None => self.modules.get(&m).copied(),
        }
    }

    /// Edges between files: (from, to) → the first line and path that makes it.
    pub fn edges(&self) -> BTreeMap<(usize, usize), (usize, String)> {
        let mut edges = BTreeMap::new();
        for (from, syn) in self.syntax.iter().enumerate() {
            for p in &syn.paths {
                // A re-export is a facade unless the file itself uses the name.
                if p.reexport
                    && (p.path.glob
                        || p.path.name.as_ref().is_none_or(|n| syn.idents.get(n).copied().unwrap_or(0) == 0))
                {
                    continue;
                }
                let Some(to) = self.resolve(&p.module, &p.path.segments, 0) else { continue };
                if to != from {
                    edges.entry((from, to)).or_insert_with(|| (p.line, p.path.segments.join("::")));
                }
            }
        }
        edges
    }
}

/// Strongly connected components with more than one node (Tarjan), each sorted.
pub fn circles(nodes: usize, edges: &BTreeSet<(usize, usize)>) -> Vec<Vec<usize>> {
    struct State {
        next: Vec<Vec<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        counter: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        s.index[v] = Some(s.counter);
        s.low[v] = s.counter;
        s.counter += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for w in s.next[v].clone() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = s.stack.pop().expect("v is on the stack");
                s.on_stack[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let mut next = vec![Vec::new(); nodes];
    for &(a, b) in edges {
        next[a].push(b);
    }
    let mut s = State {
        next,
        index: vec![None; nodes],
        low: vec![0; nodes],
        on_stack: vec![false; nodes],
        stack: Vec::new(),
        counter: 0,
        out: Vec::new(),
    };
    for v in 0..nodes {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}
