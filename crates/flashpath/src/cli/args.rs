//! Parsing the command line: value parsers whose errors say what they accept, and clap's
//! errors worded as one line naming the option.

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// Parses a whole number up to `max`, with a message that says what is accepted (clap's own
/// number errors do not).
fn bounded_number(s: &str, max: u64) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!("'{s}' is not a whole number between 0 and {max}")),
    }
}

pub(crate) fn u16_arg(s: &str) -> Result<u16, String> {
    bounded_number(s, u16::MAX.into()).map(|n| n as u16)
}

pub(crate) fn u32_arg(s: &str) -> Result<u32, String> {
    bounded_number(s, u32::MAX.into()).map(|n| n as u32)
}

pub(crate) fn u64_arg(s: &str) -> Result<u64, String> {
    bounded_number(s, u64::MAX)
}

/// Renders a clap error as one line: the option, the bad value and what is accepted.
pub(crate) fn one_line_usage_error(err: &clap::Error) -> String {
    let ctx = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        Some(ContextValue::Strings(v)) => Some(v.join(", ")),
        Some(ContextValue::StyledStr(s)) => Some(s.to_string()),
        Some(ContextValue::StyledStrs(v)) => {
            Some(v.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "))
        }
        _ => None,
    };
    // "--size <SIZE>" names the option; the value placeholder is noise here.
    let option = |kind| {
        ctx(kind)
            .map(|a| if a.starts_with('-') { a.split(' ').next().unwrap_or(&a).to_string() } else { a })
            .unwrap_or_default()
    };
    let arg = option(ContextKind::InvalidArg);
    let value = ctx(ContextKind::InvalidValue).unwrap_or_default();
    let detail = match err.kind() {
        ErrorKind::InvalidValue if value.is_empty() => Some(format!("{arg}: a value is required")),
        ErrorKind::InvalidValue => {
            let valid = ctx(ContextKind::ValidValue).unwrap_or_default();
            Some(format!("{arg}: '{value}' is not one of {valid}"))
        }
        ErrorKind::ValueValidation => {
            let why = std::error::Error::source(err).map(|s| s.to_string()).unwrap_or_default();
            // Our parsers quote the value themselves; clap's own (numbers) do not.
            if why.contains(&format!("'{value}'")) {
                Some(format!("{arg}: {why}"))
            } else {
                Some(format!("{arg}: '{value}': {why}"))
            }
        }
        ErrorKind::MissingRequiredArgument => Some(format!("missing required option {arg}")),
        ErrorKind::ArgumentConflict => {
            Some(format!("{arg} cannot be used with {}", option(ContextKind::PriorArg)))
        }
        ErrorKind::UnknownArgument => Some(match ctx(ContextKind::SuggestedArg) {
            Some(s) => format!("unknown option '{arg}' (did you mean '{s}'?)"),
            None => format!("unknown option '{arg}' (see --help)"),
        }),
        ErrorKind::InvalidSubcommand => {
            let cmd = ctx(ContextKind::InvalidSubcommand).unwrap_or_default();
            // Several close names ("grups": group, groups) are each quoted.
            let suggested = match err.get(ContextKind::SuggestedSubcommand) {
                Some(ContextValue::Strings(v)) => Some(v.join("' or '")),
                _ => ctx(ContextKind::SuggestedSubcommand),
            };
            Some(match suggested {
                Some(s) => format!("unknown command '{cmd}' (did you mean '{s}'?)"),
                None => format!("unknown command '{cmd}' (see --help)"),
            })
        }
        _ => None,
    };
    detail.unwrap_or_else(|| {
        // Anything else: clap's first line, which carries the gist.
        let text = err.render().to_string();
        text.lines().next().unwrap_or("invalid command line").trim_start_matches("error: ").to_string()
    })
}
