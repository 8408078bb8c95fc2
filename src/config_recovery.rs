//! Every problem of a file that does not parse, in the operator's words. The YAML parser stops
//! at the first error; to report the others in the same run, the line of each field-level
//! error (an unknown setting, a value of the wrong type) is blanked and the text parsed again,
//! until it parses or an error is one of YAML syntax, after which nothing later can be trusted.
//! The text that finally parses is validated as usual, less the problems that only follow
//! from a blanked line (a rule whose misspelt kind was blanked has "no kind").
//!
//! Messages are rewritten from the parser's (`invalid u64`, `unknown field`) into what the
//! operator wrote and what would be right, with a "did you mean" for misspelt names.

use crate::config::{Config, Problem};

/// Parse errors collected at most: a file with more is better fixed in rounds.
const MAX_ERRORS: usize = 20;

/// What recovery found: the parse problems, and the configuration the text parses to once
/// their lines are blanked (to validate the rest), with the blanked lines.
pub struct Recovered {
    /// One problem per parse error, in file order of discovery.
    pub problems: Vec<Problem>,
    /// The configuration without the blanked lines; `None` after a YAML syntax error.
    pub config: Option<Config>,
    /// 1-based lines blanked.
    pub blanked: Vec<u64>,
}

/// Collects every parse problem of `text` (which failed to parse).
pub fn recover(text: &str) -> Recovered {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let original = lines.clone();
    let mut out = Recovered {
        problems: Vec::new(),
        config: None,
        blanked: Vec::new(),
    };
    while out.problems.len() < MAX_ERRORS {
        let attempt = lines.join("\n");
        let error = match serde_saphyr::from_str::<Config>(&attempt) {
            Ok(config) => {
                out.config = Some(config);
                break;
            }
            Err(e) => e.to_string(),
        };
        let Some((line, message)) = located(&error) else {
            out.problems.push(Problem {
                line: 0,
                field: String::new(),
                message: first_line(&error).to_string(),
            });
            break;
        };
        let index = (line as usize).saturating_sub(1);
        let field = field_path(&original, index);
        let recoverable = field_level(message) && index < lines.len() && !lines[index].is_empty();
        let mut message = in_words(message, original.get(index).map_or("", String::as_str));
        if !recoverable {
            message.push_str(
                " (YAML syntax: look at this line and the ones above it for an unclosed bracket \
                 or quote, a tab or a wrong indentation; nothing after it was checked)",
            );
        }
        out.problems.push(Problem {
            line,
            field,
            message,
        });
        if !recoverable || out.blanked.contains(&line) {
            break;
        }
        blank(&mut lines, index);
        out.blanked.push(line);
    }
    out
}

/// Whether a problem only follows from a blanked line: a rule with no kind left (its kind's
/// line was blanked) whose block holds a blanked line.
pub fn follows_from_blanked(problem: &Problem, text: &str, blanked: &[u64]) -> bool {
    if !problem.message.contains("(found 0)") || problem.line == 0 {
        return false;
    }
    let lines: Vec<&str> = text.lines().collect();
    let (start, end) = item_block(&lines, (problem.line as usize).saturating_sub(1));
    blanked
        .iter()
        .any(|&l| (l as usize) > start && (l as usize) <= end + 1)
}

/// `(line, message)` from saphyr's `error: line L column C: message` (first line).
fn located(error: &str) -> Option<(u64, &str)> {
    let first = first_line(error);
    let rest = first.split_once("line ")?.1;
    let (line, rest) = rest.split_once(' ')?;
    let message = rest.split_once(": ").map_or(rest, |(_, m)| m);
    Some((line.parse().ok()?, message))
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text)
}

/// Errors about one field's name or value, after which the rest of the file still parses.
fn field_level(message: &str) -> bool {
    [
        "unknown field",
        "unknown variant",
        "invalid",
        "missing field",
        "expected",
    ]
    .iter()
    .any(|p| message.starts_with(p))
}

/// Blanks line `index` and the lines nested under it (more indented), keeping the numbering.
/// A section left with nothing in it becomes `key: {}`, so its emptiness is not reported as a
/// problem of its own.
fn blank(lines: &mut [String], index: usize) {
    let indent = indentation(&lines[index]);
    let is_item = lines[index].trim_start().starts_with("- ");
    lines[index].clear();
    for line in lines.iter_mut().skip(index + 1) {
        let deeper = indentation(line) > indent
            || (!is_item && indentation(line) == indent && line.trim_start().starts_with("- "));
        if line.trim().is_empty() || deeper {
            line.clear();
        } else {
            break;
        }
    }
    let Some(parent) = (0..index)
        .rev()
        .find(|&i| !lines[i].trim().is_empty() && indentation(&lines[i]) < indent)
    else {
        return;
    };
    let parent_indent = indentation(&lines[parent]);
    let emptied = lines[parent + 1..]
        .iter()
        .take_while(|l| l.trim().is_empty() || indentation(l) > parent_indent)
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
    if emptied && lines[parent].trim_end().ends_with(':') {
        lines[parent].push_str(" {}");
    }
}

fn indentation(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The dotted path of the key on line `index` (`upstream.adress`, `rules[1].mode`), from the
/// indentation of the lines above it (block style, as the shipped files are written).
fn field_path(lines: &[String], index: usize) -> String {
    let Some(line) = lines.get(index) else {
        return String::new();
    };
    let is_item = |l: &str| l.trim_start().starts_with("- ");
    // Child first; reversed at the end.
    let mut path = vec![key_of(line)];
    let mut need = indentation(line);
    // Inside a list item whose dash is at this indentation: how many items precede it.
    let mut item: Option<(usize, usize)> = is_item(line).then_some((need, 0));
    for l in lines[..index].iter().rev() {
        if l.trim().is_empty() || l.trim_start().starts_with('#') {
            continue;
        }
        let ind = indentation(l);
        match item {
            Some((dash, n)) if ind == dash && is_item(l) => item = Some((dash, n + 1)),
            Some((dash, n)) if ind <= dash && !is_item(l) => {
                path.push(format!("{}[{n}]", key_of(l)));
                item = None;
                need = ind;
            }
            Some(_) => {}
            None if ind < need && is_item(l) => {
                item = Some((ind, 0));
                need = ind;
            }
            None if ind < need => {
                path.push(key_of(l));
                need = ind;
            }
            None => {}
        }
    }
    path.retain(|p| !p.is_empty());
    path.reverse();
    path.join(".")
}

/// The key a line sets (`adress` for `  adress: x`, `id` for `- id: a`).
fn key_of(line: &str) -> String {
    let t = line.trim_start().trim_start_matches("- ").trim_start();
    t.split_once(':').map_or("", |(k, _)| k).trim().to_string()
}

/// The value a line sets, as written.
fn value_of(line: &str) -> &str {
    line.split_once(':')
        .map_or("", |(_, v)| v)
        .split(" #")
        .next()
        .unwrap_or("")
        .trim()
}

/// The lines of the list item containing line `index`: from its `- ` line to the line before
/// the next item at that indentation (or anything less indented).
fn item_block(lines: &[&str], index: usize) -> (usize, usize) {
    let start = (0..=index.min(lines.len().saturating_sub(1)))
        .rev()
        .find(|&i| lines[i].trim_start().starts_with("- "))
        .unwrap_or(index);
    let indent = lines.get(start).map_or(0, |l| indentation(l));
    let end = (start + 1..lines.len())
        .find(|&i| {
            let l = lines[i];
            !l.trim().is_empty() && indentation(l) <= indent
        })
        .map_or(lines.len().saturating_sub(1), |i| i - 1);
    (start, end)
}

/// The parser's message in the operator's words.
fn in_words(message: &str, line: &str) -> String {
    let key = key_of(line);
    let value = value_of(line);
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (name, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let choices = choices(expected);
        return match closest(name, &choices) {
            Some(s) => format!("unknown setting `{name}`; did you mean `{s}`?"),
            None => format!(
                "unknown setting `{name}`; expected one of {}",
                choices.join(", ")
            ),
        };
    }
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        let (name, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let choices = choices(expected);
        return match closest(name, &choices) {
            Some(s) => format!(
                "`{name}` is not one of {}; did you mean `{s}`?",
                choices.join(", ")
            ),
            None => format!("`{name}` is not one of {}", choices.join(", ")),
        };
    }
    let number = ["u64", "u32", "u16", "u8", "usize", "i64", "i32"]
        .iter()
        .any(|t| message.contains(t));
    if message.starts_with("invalid") && number {
        return if key.ends_with("_ms") {
            format!(
                "expected a number of milliseconds like 2000 (this setting is in ms), got `{value}`"
            )
        } else if key.ends_with("_us") {
            format!("expected a number of microseconds like 10000, got `{value}`")
        } else {
            format!("expected a whole number, got `{value}`")
        };
    }
    if message.starts_with("invalid") && message.contains("bool") {
        return format!("expected true or false, got `{value}`");
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let name = rest.split('`').next().unwrap_or(rest);
        return format!("`{name}` is required here");
    }
    message.to_string()
}

/// The names listed after saphyr's `expected one of`.
fn choices(expected: &str) -> Vec<String> {
    expected
        .split_once("expected one of ")
        .map_or("", |(_, c)| c)
        .split(',')
        .map(|c| c.trim().trim_matches('`').to_string())
        .filter(|c| !c.is_empty())
        .collect()
}

/// The candidate nearest to `name` by edit distance, if near enough to be a typo (a third of
/// its length, at least 1, at most 3 edits).
pub fn closest<S: AsRef<str>>(name: &str, candidates: &[S]) -> Option<String> {
    let limit = (name.chars().count() / 3).clamp(1, 3);
    candidates
        .iter()
        .map(|c| {
            (
                distance(&name.to_ascii_lowercase(), &c.as_ref().to_ascii_lowercase()),
                c,
            )
        })
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.as_ref().to_string())
}

/// Levenshtein distance, with a transposition counted as one edit (`adress`, `enfroce`).
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_level_error_is_reported_in_operator_words_with_its_path() {
        let text = "listen: 127.0.0.1:6380\nupstream:\n  adress: x:1\n  connections: abc\n  connect_timeout_ms: 5s\nrules:\n  - id: a\n    denny: [KEYS]\n  - id: b\n    mode: enfroce\n    deny: [KEYS]\n";
        let r = recover(text);
        let got: Vec<String> = r
            .problems
            .iter()
            .map(|p| format!("{}: {}: {}", p.line, p.field, p.message))
            .collect();
        assert_eq!(
            got,
            [
                "3: upstream.adress: unknown setting `adress`; did you mean `address`?",
                "4: upstream.connections: expected a whole number, got `abc`",
                "5: upstream.connect_timeout_ms: expected a number of milliseconds like 2000 (this setting is in ms), got `5s`",
                "8: rules[0].denny: unknown setting `denny`; did you mean `deny`?",
                "10: rules[1].mode: `enfroce` is not one of enforce, audit; did you mean `enforce`?",
            ]
        );
        assert!(r.config.is_some());
        assert_eq!(r.blanked, [3, 4, 5, 8, 10]);
    }

    #[test]
    fn a_syntax_error_stops_the_collection() {
        let r = recover("rules:\n  - id: b\n    deny: [KEYS\n  - id: c\n");
        assert_eq!(r.problems.len(), 1);
        assert!(r.config.is_none());
    }

    #[test]
    fn typos_are_near_and_others_are_not() {
        assert_eq!(
            closest("adress", &["address", "mode"]),
            Some("address".into())
        );
        assert_eq!(closest("KEY", &["keys", "get"]), Some("keys".into()));
        assert_eq!(closest("frobnicate", &["keys", "get"]), None);
    }
}
