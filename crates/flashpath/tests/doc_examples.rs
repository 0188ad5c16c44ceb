//! Every command the documentation shows is one the CLI accepts.
//!
//! The test reads README.md and docs/*.md, collects each `flashpath …` command line from their
//! shell code blocks (fenced as `sh`, `bash`, `shell`, `console` or with no language; `text`
//! blocks are output, such as a captured screen, and are not read) and parses it with the
//! command line's own clap parser. A line that is a synopsis — it shows a placeholder such as
//! `NAME`, an optional part in `[...]` or alternatives such as `tcp|pcie` — cannot be parsed as
//! it stands, so it is checked against the parser's command tree instead: its subcommands
//! (each alternative) must exist and every `--option` it names must be one the subcommand
//! takes. A failure names the file and line, the command and clap's error.
//!
//! The `./run <command>` mentions anywhere in those files are checked against the commands
//! `./run` dispatches.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};

use flashpath::cli::Cli;

/// The files whose examples are checked: README.md and every docs/*.md (not the benchmark
/// run files under docs/bench/, which record commands as they were run).
fn doc_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("reading docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the workspace root")
}

/// One logical shell line of a code block: where it starts and its text, continuation lines
/// (`\` at the end, or a quote still open) joined.
struct ShellLine {
    line: usize,
    text: String,
}

/// The logical lines of every shell code block in `markdown`.
fn shell_lines(markdown: &str) -> Vec<ShellLine> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut shell_block = false;
    let mut pending: Option<ShellLine> = None;
    for (index, raw) in markdown.lines().enumerate() {
        let trimmed = raw.trim_start();
        if let Some(fence) = trimmed.strip_prefix("```") {
            if in_block {
                in_block = false;
                if let Some(p) = pending.take() {
                    out.push(p);
                }
            } else {
                in_block = true;
                shell_block = matches!(fence.trim(), "" | "sh" | "bash" | "shell" | "console");
            }
            continue;
        }
        if !in_block || !shell_block {
            continue;
        }
        let text = trimmed.strip_prefix("$ ").unwrap_or(trimmed);
        let current = match pending.take() {
            Some(mut p) => {
                p.text.push('\n');
                p.text.push_str(text);
                p
            }
            None => ShellLine { line: index + 1, text: text.to_string() },
        };
        let continued = current.text.ends_with('\\') || open_quote(&current.text);
        if continued {
            pending = Some(current);
        } else {
            out.push(current);
        }
    }
    out
}

/// Whether `text` ends inside a quoted string (a JSON argument spread over lines).
fn open_quote(text: &str) -> bool {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut word_start = true;
    for c in text.chars() {
        match quote {
            Some('\'') if c == '\'' => quote = None,
            Some('"') if escaped => escaped = false,
            Some('"') if c == '\\' => escaped = true,
            Some('"') if c == '"' => quote = None,
            Some(_) => {}
            None if c == '#' && word_start => return false,
            None if c == '\'' || c == '"' => quote = Some(c),
            None => {}
        }
        word_start = quote.is_none() && c.is_whitespace();
    }
    quote.is_some()
}

/// A shell word or an operator between commands.
#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    /// `;`, `&`, `&&`, `|`, `||`, a newline: the end of a simple command.
    Separator,
    /// A redirection (`>`, `2>`, `<`), whose target word follows.
    Redirect,
}

/// Splits a logical line as a POSIX shell would, well enough for documentation: quotes,
/// backslash escapes and line continuations, comments, command separators and redirections.
fn tokenize(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = text.chars().peekable();
    let end_word = |tokens: &mut Vec<Token>, word: &mut String, in_word: &mut bool| {
        if *in_word {
            tokens.push(Token::Word(std::mem::take(word)));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some(next) => {
                    word.push(next);
                    in_word = true;
                }
            },
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' if matches!(chars.peek(), Some('"' | '\\' | '$')) => {
                            word.push(chars.next().expect("peeked"));
                        }
                        _ => word.push(q),
                    }
                }
            }
            '#' if !in_word => {
                // A comment runs to the end of its line; a continued line goes on after it.
                for q in chars.by_ref() {
                    if q == '\n' {
                        break;
                    }
                }
                tokens.push(Token::Separator);
            }
            ';' | '&' | '\n' => {
                end_word(&mut tokens, &mut word, &mut in_word);
                if c == '&' && chars.peek() == Some(&'&') {
                    chars.next();
                }
                tokens.push(Token::Separator);
            }
            '|' if !in_word => {
                if chars.peek() == Some(&'|') {
                    chars.next();
                }
                tokens.push(Token::Separator);
            }
            '>' | '<' => {
                // `2>` is a redirection of fd 2, not the word "2".
                if word.chars().all(|d| d.is_ascii_digit()) {
                    word.clear();
                    in_word = false;
                }
                end_word(&mut tokens, &mut word, &mut in_word);
                if chars.peek() == Some(&'>') || chars.peek() == Some(&'&') {
                    chars.next();
                }
                tokens.push(Token::Redirect);
            }
            c if c.is_whitespace() => end_word(&mut tokens, &mut word, &mut in_word),
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    end_word(&mut tokens, &mut word, &mut in_word);
    tokens
}

/// Programs that run another program given later on their command line.
const WRAPPERS: &[&str] = &["sudo", "env", "taskset", "nice", "timeout", "valgrind", "exec", "time"];

fn is_flashpath(word: &str) -> bool {
    word == "flashpath" || word.ends_with("/release/flashpath") || word.ends_with("/debug/flashpath")
}

/// The `flashpath` invocations in one logical line: the arguments after the program name.
fn invocations(text: &str) -> Vec<Vec<String>> {
    let mut commands = vec![Vec::new()];
    let mut redirect_target = false;
    for token in tokenize(text) {
        match token {
            Token::Separator => commands.push(Vec::new()),
            Token::Redirect => redirect_target = true,
            Token::Word(w) => {
                if !std::mem::take(&mut redirect_target) {
                    commands.last_mut().expect("never empty").push(w);
                }
            }
        }
    }
    let mut out = Vec::new();
    for words in commands {
        // Environment assignments before the program (`FLASHPATH_RPC=... flashpath ...`).
        let mut rest = words.iter().skip_while(|w| {
            w.split_once('=')
                .is_some_and(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        });
        let Some(program) = rest.next() else { continue };
        let args: Vec<String> = if is_flashpath(program) {
            rest.cloned().collect()
        } else if WRAPPERS.contains(&program.as_str()) {
            match rest.position(|w| is_flashpath(w)) {
                Some(_) => rest.cloned().collect(),
                None => continue,
            }
        } else {
            continue;
        };
        out.push(args);
    }
    out
}

/// A placeholder in a synopsis: `NAME`, `HOST:PORT`, `HOST_NQN` (capitals, `_` and `:` only).
fn is_placeholder(word: &str) -> bool {
    word.len() >= 2
        && word.chars().all(|c| c.is_ascii_uppercase() || c == '_' || c == ':')
        && word.chars().next().is_some_and(|c| c.is_ascii_uppercase())
}

/// Whether `args` is a synopsis rather than a command to run.
fn is_synopsis(args: &[String]) -> bool {
    args.iter().any(|w| {
        w.contains('[') && !w.starts_with('{') && !w.contains("]:")
            || w.contains(']') && !w.contains("]:") && !w.ends_with('}')
            || w.contains('|') && !w.contains("://")
            || w.contains("...")
            || w.contains('…')
            || is_placeholder(w.trim_matches(|c| c == '[' || c == ']'))
    })
}

/// Checks a synopsis against the command tree: each subcommand (every alternative of
/// `add|remove`) exists, and every `--option` named is one its subcommand (or a global) takes.
fn check_synopsis(args: &[String]) -> Result<(), String> {
    let root = Cli::command();
    let mut frontier = vec![root.clone()];
    let mut words = args.iter().peekable();
    // Global options before the subcommand.
    while let Some(w) = words.peek().copied() {
        if !w.starts_with('-') {
            break;
        }
        words.next();
        if !w.contains('=')
            && root
                .get_arguments()
                .any(|a| a.get_long() == Some(w.trim_start_matches('-')) && a.get_action().takes_values())
        {
            words.next();
        }
    }
    let mut depth = 0;
    while let Some(w) = words.peek().copied() {
        let alternatives: Vec<&str> = w.split('|').collect();
        let next: Vec<clap::Command> = frontier
            .iter()
            .flat_map(|cmd| alternatives.iter().filter_map(|name| cmd.find_subcommand(name).cloned()))
            .collect();
        if next.is_empty() {
            break;
        }
        if next.len() != alternatives.len() * frontier.len() {
            return Err(format!("not every one of `{w}` is a subcommand"));
        }
        frontier = next;
        depth += 1;
        words.next();
    }
    if depth == 0 {
        return Err("no subcommand".into());
    }
    for word in words {
        for part in word.split(['[', ']', '|']) {
            let Some(long) = part.strip_prefix("--") else { continue };
            let long = long.split('=').next().unwrap_or(long);
            for cmd in &frontier {
                let known = cmd.get_arguments().chain(root.get_arguments()).any(|a| {
                    a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|al| al.contains(&long))
                });
                if !known {
                    return Err(format!("`{}` takes no option `--{long}`", cmd.get_name()));
                }
            }
        }
    }
    Ok(())
}

/// Parses one documented command, or checks it as a synopsis.
fn check(args: &[String]) -> Result<(), String> {
    if is_synopsis(args) {
        return check_synopsis(args).map_err(|e| format!("synopsis: {e}"));
    }
    let argv = std::iter::once("flashpath".to_string()).chain(args.iter().cloned());
    match Cli::try_parse_from(argv) {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e.to_string().lines().next().unwrap_or_default().to_string()),
    }
}

#[test]
fn every_documented_command_parses() {
    let root = workspace_root();
    let mut checked = 0;
    let mut failures = String::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).expect("reading a doc");
        let name = file.strip_prefix(&root).unwrap_or(&file).display().to_string();
        for line in shell_lines(&text) {
            for args in invocations(&line.text) {
                checked += 1;
                if let Err(e) = check(&args) {
                    writeln!(failures, "{name}:{}: `flashpath {}`: {e}", line.line, args.join(" ")).unwrap();
                }
            }
        }
    }
    assert!(failures.is_empty(), "documented commands the CLI refuses:\n{failures}");
    // The docs show dozens of commands; finding few means the extraction broke, not the docs.
    assert!(checked >= 60, "only {checked} documented flashpath commands found");
}

/// The commands `./run` dispatches: the labels of its `case` on the first argument.
fn run_commands() -> Vec<String> {
    let script = std::fs::read_to_string(workspace_root().join("run")).expect("reading ./run");
    script
        .lines()
        .filter_map(|l| l.strip_prefix("    ")?.strip_suffix(')'))
        .filter(|label| !label.is_empty() && label.chars().all(|c| c.is_ascii_lowercase()))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_documented_run_command_exists() {
    let commands = run_commands();
    for expected in ["demo", "test", "bench", "soak"] {
        assert!(commands.iter().any(|c| c == expected), "./run's commands read as {commands:?}");
    }
    let root = workspace_root();
    let mut failures = String::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).expect("reading a doc");
        let name = file.strip_prefix(&root).unwrap_or(&file).display().to_string();
        for (index, line) in text.lines().enumerate() {
            for (at, _) in line.match_indices("./run ") {
                let word: String =
                    line[at + 6..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
                if word.is_empty() || word.starts_with('<') {
                    continue;
                }
                if !commands.contains(&word) {
                    writeln!(
                        failures,
                        "{name}:{}: `./run {word}`: ./run has no such command ({commands:?})",
                        index + 1
                    )
                    .unwrap();
                }
            }
        }
    }
    assert!(failures.is_empty(), "documented ./run commands that do not exist:\n{failures}");
}

#[test]
fn a_wrong_example_is_refused() {
    // Positional arguments `vhost create` does not take.
    let wrong = invocations("flashpath vhost create vhost.1 Nvme1n1   # a comment");
    assert_eq!(wrong.len(), 1);
    assert!(check(&wrong[0]).is_err());
    let right = invocations("flashpath vhost create --name vhost.1 --disk Nvme1n1");
    assert_eq!(check(&right[0]), Ok(()));
}

#[test]
fn a_synopsis_is_checked_against_the_command_tree() {
    let good = invocations("flashpath nvmf listener add|remove NQN HOST:PORT");
    assert_eq!(check(&good[0]), Ok(()));
    let options =
        invocations("flashpath nvme options [--timeout-us US] [--action-on-timeout none|abort|reset]");
    assert_eq!(check(&options[0]), Ok(()));
    let unknown_option = invocations("flashpath nvme list [--no-such-option]");
    assert!(check(&unknown_option[0]).is_err());
    let unknown_alternative = invocations("flashpath nvmf listener add|frobnicate NQN HOST:PORT");
    assert!(check(&unknown_alternative[0]).is_err());
}

#[test]
fn the_shell_reading_handles_what_the_docs_use() {
    let text = "x\n```sh\nflashpath rpc m '{\"a\":\n  1}'   # json over two lines\n\
                FLASHPATH_RPC=/s flashpath stats | head; flashpath raid remove r1 && flashpath top\n\
                taskset -c 0 valgrind --tool=callgrind \\\n    target/release/flashpath serve --cpus 0 &\n\
                echo flashpath > /dev/null\n```\n```text\nflashpath top  rpc /s  refresh 1 s\n```\n";
    let lines = shell_lines(text);
    let all: Vec<Vec<String>> = lines.iter().flat_map(|l| invocations(&l.text)).collect();
    let expected: Vec<Vec<String>> = vec![
        vec!["rpc".into(), "m".into(), "{\"a\":\n1}".into()],
        vec!["stats".into()],
        vec!["raid".into(), "remove".into(), "r1".into()],
        vec!["top".into()],
        vec!["serve".into(), "--cpus".into(), "0".into()],
    ];
    assert_eq!(all, expected);
    assert_eq!(lines[0].line, 3);
}
