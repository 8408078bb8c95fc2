//! Where a value of the file was written, and what is wrong with it: [`Located`] values and
//! the [`Problem`]s validation reports (file, line, field, message).

use std::fmt;
use std::path::Path;

use serde_saphyr::{Location, Spanned};

/// A value from the file together with where it was written, for validation messages.
/// Defaults carry `Location::UNKNOWN` and are reported as "(default)".
pub(crate) type Located<T> = Spanned<T>;

/// A value of no place in the file (a default).
pub(crate) fn located<T>(value: T) -> Located<T> {
    Spanned {
        value,
        referenced: Location::UNKNOWN,
        defined: Location::UNKNOWN,
    }
}

/// One validation problem: where, which field, and what is wrong.
#[derive(Debug, Clone)]
pub struct Problem {
    /// 1-based line in the file; 0 when the value came from a default or the command line.
    pub line: u64,
    /// Dotted path of the field, e.g. `upstream.connections`.
    pub field: String,
    /// What is wrong and what would be right.
    pub message: String,
}

/// Every problem, one line each, as `render` writes it.
pub(super) fn render_problems(path: &Path, problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| p.render(path))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Problem {
    /// `FILE:LINE: field `…`: message` (without the line or the field when it has none).
    pub fn render(&self, path: &Path) -> String {
        let mut out = path.display().to_string();
        if self.line > 0 {
            out.push_str(&format!(":{}", self.line));
        }
        if !self.field.is_empty() {
            out.push_str(&format!(": field `{}`", self.field));
        }
        out.push_str(&format!(": {}", self.message));
        out
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: `{}`: {}", self.line, self.field, self.message)
    }
}

/// `Debug` output without the `Location { … }` of each value: where a value was written is not
/// part of the setting.
pub(crate) fn without_locations(debug: &str) -> String {
    let mut out = String::with_capacity(debug.len());
    let mut rest = debug;
    while let Some(at) = rest.find("Location {") {
        out.push_str(&rest[..at]);
        let mut depth = 0usize;
        let mut end = rest.len();
        for (i, c) in rest[at..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = at + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}
