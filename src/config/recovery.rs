//! Every problem of a file that does not parse, once each, in the operator's words.
//!
//! The file is first read leniently ([`yaml::Tree`]): YAML that does not read at all gets one
//! message saying what is broken where (a tab, a quote or bracket never closed, a line indented
//! so that it belongs to nothing), after which nothing else can be trusted. YAML that reads is
//! then parsed strictly, again and again: each error of the parser's (an unknown setting, a
//! value of the wrong type, a required setting missing) is found in the tree by its location,
//! which gives the field's path and the line of its key, is put in words, and its entry is
//! removed from the text (blanked, so every other line keeps its number) before the next try.
//! What the removals cause is not reported: a required setting missing because its misspelt
//! line was removed, a rule left without a kind, a setting that only made sense with the
//! removed one. The text that finally parses is validated as usual.
//!
//! Messages never quote the parser ("expected sequence start", "invalid u64"): they say what
//! the operator wrote and what would be right, with a "did you mean" for misspelt names.

use crate::config::yaml::{self, Broken, Kind, Node, Slot, Syntax, Tree};
use crate::config::{Config, Problem};

/// Parse errors collected at most: a file with more is better fixed in rounds.
const MAX_ERRORS: usize = 20;

/// The key no struct has, whose rejection lists the fields a struct has.
const PROBE: &str = "zz_probe";

/// What recovery found: the parse problems, and the configuration the text parses to once
/// their entries are removed (to validate the rest).
#[derive(Default)]
pub(crate) struct Recovered {
    /// One problem per parse error, in order of discovery.
    pub(crate) problems: Vec<Problem>,
    /// The configuration without the removed entries; `None` after a YAML syntax error.
    pub(crate) config: Option<Config>,
    /// 1-based lines whose entries were removed.
    pub(crate) blanked: Vec<u64>,
    /// Paths removed, as in the file.
    removed: Vec<String>,
    /// List items removed, in order: the list's path and the item's index, in the numbering
    /// of the text at the time (each removal renumbers the items after it).
    items: Vec<(String, usize)>,
}

impl Recovered {
    /// `path` (of the text after the removals) as the file numbers its list items.
    pub(crate) fn original_path(&self, path: &str) -> String {
        let mut path = path.to_string();
        for (list, index) in self.items.iter().rev() {
            let Some(rest) = path.strip_prefix(&format!("{list}[")) else {
                continue;
            };
            let Some((n, tail)) = rest.split_once(']') else {
                continue;
            };
            if let Ok(n) = n.parse::<usize>() {
                if n >= *index {
                    path = format!("{list}[{}]{tail}", n + 1);
                }
            }
        }
        path
    }

    /// Whether a validation problem of the configuration that finally parsed (its field as
    /// in the file) only follows from a removal: it is about a removed entry or what it held,
    /// it is its section's "required"/"needs a kind" problem, or it names the removed setting
    /// (`is only used when upstream.mode is cluster` once `upstream.mode` was removed).
    pub(crate) fn follows_from_removal(&self, p: &Problem) -> bool {
        let under = |path: &str, of: &str| {
            path.strip_prefix(of)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        };
        self.removed.iter().any(|r| {
            let named = without_indices(r);
            under(&p.field, r)
                || (under(r, &p.field)
                    && ["(found 0)", "is required", "must give"]
                        .iter()
                        .any(|m| p.message.contains(m)))
                || (named.contains('.') && p.message.contains(&named))
        })
    }
}

/// `rules[2].ttl` -> `rules.ttl`.
fn without_indices(path: &str) -> String {
    let mut out = String::new();
    let mut skip = false;
    for c in path.chars() {
        match c {
            '[' => skip = true,
            ']' => skip = false,
            _ if !skip => out.push(c),
            _ => {}
        }
    }
    out
}

/// Collects every parse problem of `text` (which failed to parse).
pub(crate) fn recover(text: &str) -> Recovered {
    let mut out = Recovered::default();
    let tree = match Tree::parse(text) {
        Ok(t) => t,
        Err(broken) => {
            out.problems.push(syntax_problem(&broken, text));
            return out;
        }
    };
    let mut work = text.as_bytes().to_vec();
    // A key given twice: reported at the later one, which is removed (the first one counts).
    for (path, at, first) in tree.duplicates() {
        let Some(slot) = tree.key_at(at.line, at.col) else {
            continue;
        };
        out.problems.push(Problem {
            line: at.line,
            field: path.clone(),
            message: format!("is given twice (also on line {first}); keep one"),
        });
        blank_slot(&mut work, &slot);
        out.removed.push(path);
        out.blanked.push(at.line);
    }
    while out.problems.len() < MAX_ERRORS {
        let attempt = String::from_utf8_lossy(&work).into_owned();
        let error = match Config::parse_yaml(&attempt) {
            Ok(config) => {
                out.config = Some(config);
                break;
            }
            Err(e) => e,
        };
        // The removals keep the text YAML; if they did not, say what the parser said.
        let Ok(tree) = Tree::parse(&attempt) else {
            out.problems.push(unplaced(&error));
            break;
        };
        let Some(step) = understand(&error, &tree) else {
            out.problems.push(unplaced(&error));
            break;
        };
        let Some(slot) = step.slot else {
            // A required setting missing at the top level, a second document: nothing to
            // remove.
            out.problems.extend(step.problem);
            break;
        };
        let path = out.original_path(&slot.path);
        if out.removed.contains(&path) {
            break;
        }
        // A required setting is missing because an entry of its section was removed (its
        // misspelt or mistyped line): that entry's problem says it all.
        let caused = step.missing
            && out.removed.iter().any(|r| {
                r.strip_prefix(&path)
                    .is_some_and(|rest| rest.starts_with(['.', '[']))
            });
        if let Some(mut p) = step.problem.filter(|_| !caused) {
            p.field = out.original_path(&p.field);
            out.problems.push(p);
        }
        if slot.key.is_none() {
            let list = slot
                .path
                .rsplit_once('[')
                .map_or("", |(l, _)| l)
                .to_string();
            out.items.push((list, slot.index));
        }
        out.blanked.push(slot.line);
        out.removed.push(path);
        blank_slot(&mut work, &slot);
    }
    out
}

/// One parse error understood: the entry or item to remove, and the problem to report
/// (none when it only follows from an earlier removal).
struct Step<'a> {
    slot: Option<Slot<'a>>,
    problem: Option<Problem>,
    /// A required setting of `slot`'s section is missing.
    missing: bool,
}

/// The parser's error, unwrapped from snippets and aliases.
fn innermost(e: &serde_saphyr::Error) -> &serde_saphyr::Error {
    let mut e = e.without_snippet();
    while let serde_saphyr::Error::AliasError { error, .. }
    | serde_saphyr::Error::WithSnippet { error, .. } = e
    {
        e = error;
    }
    e
}

/// Where `error` is in `tree`, and what to say about it.
fn understand<'a>(error: &serde_saphyr::Error, tree: &'a Tree) -> Option<Step<'a>> {
    use serde_saphyr::Error as E;
    let e = innermost(error);
    let loc = e.location()?;
    let (line, col) = (loc.line(), (loc.column() as usize).saturating_sub(1));
    let problem = |slot: &Slot<'_>, message: String| Problem {
        line: slot.line,
        field: slot.path.clone(),
        message,
    };
    let step = match e {
        E::SerdeUnknownField {
            field, expected, ..
        } => {
            let slot = tree.key_at(line, col)?;
            let message = unknown_setting(field, expected, &slot);
            Step {
                problem: Some(problem(&slot, message)),
                slot: Some(slot),
                missing: false,
            }
        }
        E::SerdeMissingField { field, .. } => {
            let Some(slot) = tree.owner_of_key_at(line, col) else {
                return Some(Step {
                    slot: None,
                    problem: Some(Problem {
                        line: 0,
                        field: (*field).to_string(),
                        message: required(field),
                    }),
                    missing: true,
                });
            };
            Step {
                problem: Some(Problem {
                    line: slot.line,
                    field: yaml::join(&slot.path, field),
                    message: required(field),
                }),
                slot: Some(slot),
                missing: true,
            }
        }
        E::SerdeUnknownVariant {
            variant, expected, ..
        } => {
            let slot = tree.value_at(line, col)?;
            let choices: Vec<String> = expected.iter().map(|s| (*s).to_string()).collect();
            let message = match suggest(variant, &choices) {
                Some(s) => format!(
                    "`{variant}` is not one of {}; did you mean `{s}`?",
                    choices.join(", ")
                ),
                None => format!("`{variant}` is not one of {}", choices.join(", ")),
            };
            Step {
                problem: Some(problem(&slot, message)),
                slot: Some(slot),
                missing: false,
            }
        }
        E::MultipleDocuments { .. } => Step {
            slot: None,
            problem: Some(Problem {
                line,
                field: String::new(),
                message: "a second YAML document begins here (after `---`); a policy file \
                          is one document"
                    .into(),
            }),
            missing: false,
        },
        E::InvalidScalar { ty, .. } => value_step(tree, line, col, &Want::from_type(ty))?,
        E::InvalidBooleanStrict { .. } => value_step(tree, line, col, &Want::Bool)?,
        E::NullIntoString { .. } => value_step(tree, line, col, &Want::One)?,
        E::SerdeInvalidType { expected, .. } | E::SerdeInvalidValue { expected, .. } => {
            value_step(tree, line, col, &Want::from_serde(expected))?
        }
        E::Unexpected { expected, .. } => {
            let want = match *expected {
                "sequence start" => Want::List,
                "mapping start" | "empty mapping start" => Want::Settings,
                _ => Want::One,
            };
            value_step(tree, line, col, &want)?
        }
        _ => return None,
    };
    Some(step)
}

/// What a value should have been.
enum Want {
    List,
    Settings,
    One,
    Bool,
    Fraction,
    /// A whole number; `true` when it may not be negative.
    Number(bool),
}

impl Want {
    fn from_type(ty: &str) -> Want {
        match ty {
            "boolean" | "bool" => Want::Bool,
            "floating point" | "f64" | "f32" => Want::Fraction,
            t if t.starts_with('u') => Want::Number(true),
            _ => Want::Number(false),
        }
    }

    fn from_serde(expected: &str) -> Want {
        if expected.contains("sequence") {
            Want::List
        } else if expected.contains("map") || expected.starts_with("struct") {
            Want::Settings
        } else if expected.contains("bool") {
            Want::Bool
        } else if expected.contains("f64") || expected.contains("float") {
            Want::Fraction
        } else if ["u8", "u16", "u32", "u64", "usize"]
            .iter()
            .any(|t| expected.contains(t))
        {
            Want::Number(true)
        } else if expected.contains("i32") || expected.contains("i64") {
            Want::Number(false)
        } else {
            Want::One
        }
    }
}

/// A value of the wrong kind at `line`, `col`.
fn value_step<'a>(tree: &'a Tree, line: u64, col: usize, want: &Want) -> Option<Step<'a>> {
    if let Some(root) = tree
        .root
        .as_ref()
        .filter(|r| r.start.line == line && r.start.col == col)
    {
        // The whole file is not settings: nothing to remove, nothing else to check.
        return Some(Step {
            slot: None,
            problem: Some(Problem {
                line,
                field: String::new(),
                message: format!(
                    "a policy file is settings, one `key: value` per line (such as \
                     `listen: 127.0.0.1:6380`), not {}",
                    root.describe()
                ),
            }),
            missing: false,
        });
    }
    let slot = tree.value_at(line, col)?;
    let message = wrong_value(&slot, want);
    Some(Step {
        problem: Some(Problem {
            line: slot.line,
            field: slot.path.clone(),
            message,
        }),
        slot: Some(slot),
        missing: false,
    })
}

/// The last key of a path (`max` of `rules[0].ttl.max`), or the list's for an item.
fn last_key(path: &str) -> &str {
    let path = path.trim_end_matches(|c: char| c == ']' || c.is_ascii_digit());
    let path = path.strip_suffix('[').unwrap_or(path);
    path.rsplit('.').next().unwrap_or(path)
}

/// Sizes written in bytes.
fn is_bytes(key: &str) -> bool {
    key.ends_with("_bytes") || ["max_bulk_len", "max_inline_len", "max_query_buffer"].contains(&key)
}

/// An example of what a section holds, for a value written where its settings go.
fn example_of(section: &str) -> Option<&'static str> {
    Some(match section {
        "upstream" => "address: 127.0.0.1:6379",
        "limits" => "max_clients: 10000",
        "admin" => "listen: 127.0.0.1:8379",
        "tls" => "cert_file: /etc/redis-policy-proxy/tls/proxy.pem",
        "audit" => "commands: writes",
        "keyspace" => "sample: 100",
        "access" => "require_auth: true",
        "cluster" => "seeds: [127.0.0.1:7000]",
        "sentinel" => "master_name: mymaster",
        "rate_limit" => "requests: 100",
        "ttl" => "default: 1h",
        "scripts" => "allow: listed",
        "dedicated_caps" => "per_tenant_percent: 50",
        _ => return None,
    })
}

/// A value of the wrong kind, in words.
fn wrong_value(slot: &Slot<'_>, want: &Want) -> String {
    let found = slot.value.describe();
    let value = if slot.value.is_null() {
        ""
    } else {
        slot.value.text()
    };
    let key = last_key(&slot.path);
    if slot.value.is_null() && slot.key.is_some() {
        let example = match want {
            Want::Settings => example_of(key).map(|e| format!(" (such as `{e}`)")),
            _ => None,
        };
        return format!(
            "`{key}:` is given no value: write it after the colon, or on the lines under it, \
             indented{}; or remove the line",
            example.unwrap_or_default()
        );
    }
    match want {
        Want::List => match &slot.value.kind {
            Kind::Scalar(_) if !value.is_empty() => format!(
                "expected a list, such as `[{value}]` (or one `- {value}` line per item under \
                 `{key}:`), not `{value}` alone"
            ),
            Kind::Map { .. } => "expected a list here, each item on its own line starting \
                                 with `- ` (such as `- id: …`); found settings (`key: value`) \
                                 without a `- `"
                .into(),
            _ => format!("expected a list here, found {found}"),
        },
        Want::Settings => match (&slot.value.kind, slot.key) {
            (Kind::Scalar(_), None) if key == "rules" && !value.is_empty() => format!(
                "a rule is settings, not `{value}` alone: write `- id: {value}` and, on the next \
                 line indented like `id`, its kind, such as `deny: [KEYS]`"
            ),
            (Kind::Scalar(_), Some(_)) if !value.is_empty() => match example_of(key) {
                Some(example) => format!(
                    "`{key}` holds settings, each on its own line indented under `{key}:` (such \
                     as `{example}`), not `{value}`"
                ),
                None => format!(
                    "`{key}` holds settings, each on its own line indented under `{key}:`, not \
                     `{value}`"
                ),
            },
            _ => format!("expected settings here (`key: value`), found {found}"),
        },
        Want::One => format!("expected a single value here, found {found}"),
        Want::Bool => format!("expected true or false, got {found}"),
        Want::Fraction => format!("expected a number such as 0.1 (a fraction), got {found}"),
        Want::Number(unsigned) => {
            if *unsigned && value.starts_with('-') {
                format!("expected a whole number, 0 or more, got {found}")
            } else if key.ends_with("_ms") {
                format!(
                    "expected a number of milliseconds like 2000 (this setting is in ms), got \
                     {found}"
                )
            } else if key.ends_with("_us") {
                format!("expected a number of microseconds like 10000, got {found}")
            } else if is_bytes(key) {
                format!(
                    "expected a number of bytes like 102400 (sizes are written in bytes, \
                     without a unit), got {found}"
                )
            } else {
                format!("expected a whole number, got {found}")
            }
        }
    }
}

/// An unknown setting, with the nearest known one, or the section it belongs to.
fn unknown_setting(name: &str, expected: &[&str], slot: &Slot<'_>) -> String {
    let choices: Vec<String> = expected.iter().map(|s| (*s).to_string()).collect();
    if let Some(s) = suggest(name, &choices) {
        return format!("unknown setting `{name}`; did you mean `{s}`?");
    }
    // Dedented out of the section above it: `connections:` under `upstream:` by mistake.
    if let Some(section) = section_before(slot) {
        if fields_at(&section).iter().any(|f| f == name) {
            let shown = last_key(&section);
            return format!(
                "unknown setting `{name}` here; it is a setting of `{shown}`: indent it under \
                 `{shown}:`, like the lines above it"
            );
        }
    }
    format!(
        "unknown setting `{name}`; expected one of {}",
        choices.join(", ")
    )
}

/// The path of the entry before `slot` in its section, if its value is settings.
fn section_before(slot: &Slot<'_>) -> Option<String> {
    let before = slot.index.checked_sub(1)?;
    let Kind::Map { entries, .. } = &slot.parent.kind else {
        return None;
    };
    let (key, value) = entries.get(before)?;
    if !matches!(value.kind, Kind::Map { .. }) {
        return None;
    }
    let parent = slot
        .path
        .strip_suffix(slot.key.map_or("", Node::text))
        .unwrap_or("")
        .trim_end_matches('.');
    Some(yaml::join(parent, key.text()))
}

/// The fields the struct at `path` accepts, asked from the parser (empty when there is no
/// struct there).
fn fields_at(path: &str) -> Vec<String> {
    let mut yaml = String::new();
    let mut indent = 0;
    for step in steps(path) {
        let pad = " ".repeat(indent);
        match step {
            Some(key) => yaml.push_str(&format!("{pad}{key}:\n")),
            None => yaml.push_str(&format!("{pad}-\n")),
        }
        indent += 2;
    }
    yaml.push_str(&format!("{}{PROBE}: 1\n", " ".repeat(indent)));
    match Config::parse_yaml(&yaml).map_err(|e| {
        if let serde_saphyr::Error::SerdeUnknownField { expected, .. } = innermost(&e) {
            expected.iter().map(|s| (*s).to_string()).collect()
        } else {
            Vec::new()
        }
    }) {
        Ok(_) => Vec::new(),
        Err(fields) => fields,
    }
}

/// `rules[0].ttl` -> `rules`, item, `ttl` (`None` for an item).
fn steps(path: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let mut rest = part;
        if let Some(at) = rest.find('[') {
            if at > 0 {
                out.push(Some(rest[..at].to_string()));
            }
            rest = &rest[at..];
            while rest.starts_with('[') {
                out.push(None);
                rest = rest.split_once(']').map_or("", |(_, r)| r);
            }
        } else {
            out.push(Some(rest.to_string()));
        }
    }
    out
}

/// "is required", with what the setting is for where it helps.
fn required(field: &str) -> String {
    let what = match field {
        "id" => "a word naming the rule in refusals, logs and metrics, such as `deny-keys`",
        "requests" => "how many commands a window allows, such as 100",
        "window_ms" => "the window's length in milliseconds, such as 60000",
        "default" => "the TTL of keys no prefix matches, such as 1h",
        "prefix" => "the key prefix, such as `session:`",
        "ttl" => "a duration such as 15m, or none",
        "name" => "the name",
        "password_sha256" => "the hex SHA-256 of the password (printf %s 'secret' | sha256sum)",
        "tenant" => "the tenant's name",
        "allow" => "all, listed or none",
        "ca_file" => "the PEM file of the CA that signs the upstream's certificate",
        _ => "",
    };
    if what.is_empty() {
        format!("`{field}` is required here and missing")
    } else {
        format!("`{field}` is required here and missing: {what}")
    }
}

/// An error the tree cannot place: its first line, without the parser's position.
fn unplaced(error: &serde_saphyr::Error) -> Problem {
    let e = innermost(error);
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("");
    let message = first
        .split_once(": ")
        .filter(|(head, _)| head.contains("line"))
        .map_or(first, |(_, m)| m);
    let message = message.rsplit_once(" at line ").map_or(message, |(m, _)| m);
    Problem {
        line: e.location().map_or(0, |l| l.line()),
        field: String::new(),
        message: format!("the file cannot be read here ({message})"),
    }
}

/// Blanks the text of an entry (key and value) or item, keeping every line's number and
/// every other character's position. A section left with nothing gets `{}` (or `[]`) where
/// the entry was, so its emptiness is not a problem of its own.
fn blank_slot(text: &mut [u8], slot: &Slot<'_>) {
    let (mut start, mut end) = (
        slot.key.map_or(slot.value.start.byte, |k| k.start.byte),
        slot.value.end.byte.max(slot.value.start.byte),
    );
    if let Some(key) = slot.key {
        // `key:` with nothing after it: its value is empty, at the colon.
        end = end.max(key.end.byte);
        while end < text.len() && text[end] == b' ' {
            end += 1;
        }
        if end < text.len() && text[end] == b':' {
            end += 1;
        }
    }
    if slot.key.is_none() && !slot.parent.is_flow() {
        // A block item: from its `-`.
        if let Some(dash) = text[..start.min(text.len())]
            .iter()
            .rposition(|&b| b == b'-')
        {
            start = dash;
        }
    }
    if slot.parent.is_flow() {
        // The comma after it, or else the one before it.
        let after = text[end.min(text.len())..]
            .iter()
            .position(|&b| !b.is_ascii_whitespace());
        match after.map(|i| end + i) {
            Some(i) if text[i] == b',' => end = i + 1,
            _ => {
                if let Some(i) = text[..start]
                    .iter()
                    .rposition(|&b| !b.is_ascii_whitespace())
                {
                    if text[i] == b',' {
                        start = i;
                    }
                }
            }
        }
    }
    let end = end.min(text.len());
    for b in &mut text[start..end] {
        if *b != b'\n' {
            *b = b' ';
        }
    }
    if slot.parent.len() == 1 && !slot.parent.is_flow() && end >= start + 2 {
        let empty: &[u8] = if slot.key.is_some() { b"{}" } else { b"[]" };
        text[start..start + 2].copy_from_slice(empty);
    }
}

/// Broken YAML, in words: what is wrong on which line, and what it would be.
fn syntax_problem(s: &Syntax, text: &str) -> Problem {
    let lines: Vec<&str> = text.lines().collect();
    let line_text = |n: u64| {
        lines
            .get((n as usize).wrapping_sub(1))
            .copied()
            .unwrap_or("")
    };
    let parent = |path: &str| -> String {
        match path.rfind(['.', '[']) {
            Some(i) => path[..i].to_string(),
            None => String::new(),
        }
    };
    let (line, field, message) = match s.kind {
        Broken::Tab => {
            let key = key_of(line_text(s.at.line));
            (
                s.at.line,
                yaml::join(&s.path, &key),
                "this line is indented with a tab; YAML indentation must be spaces: replace \
                 the tab with spaces"
                    .to_string(),
            )
        }
        Broken::UnclosedQuote => {
            let quote = line_text(s.at.line)
                .chars()
                .nth(s.at.col)
                .filter(|c| *c == '"' || *c == '\'')
                .unwrap_or('"');
            (
                s.at.line,
                s.path.clone(),
                format!(
                    "the quote `{quote}` opened on this line is never closed: end the value \
                     with `{quote}`"
                ),
            )
        }
        Broken::UnclosedBracket => match &s.open_flow {
            Some((path, at, open)) => {
                let (what, close) = if *open == '[' {
                    ("list", ']')
                } else {
                    ("settings", '}')
                };
                (
                    at.line,
                    path.clone(),
                    format!(
                        "the {what} opened with `{open}` on this line is never closed with \
                         `{close}`"
                    ),
                )
            }
            None => (
                s.at.line,
                s.path.clone(),
                "a `[` or `{` on this line or above it is never closed".to_string(),
            ),
        },
        Broken::ValueContinues => {
            // `key:value` without a space reads as text, not a setting.
            let glued = s.last_scalar.and_then(|(start, _)| {
                let from: String = line_text(start.line).chars().skip(start.col).collect();
                let (key, rest) = from.split_once(':')?;
                let ok = !key.is_empty()
                    && key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                    && rest.chars().next().is_some_and(|c| !c.is_whitespace());
                ok.then(|| (start.line, key.to_string(), rest.trim_end().to_string()))
            });
            match glued {
                Some((line, key, value)) => (
                    line,
                    yaml::join(&s.path, &key),
                    format!("put a space after the colon: `{key}: {value}`, not `{key}:{value}`"),
                ),
                None => indentation(s, line_text(s.at.line), &parent),
            }
        }
        Broken::Indentation => indentation(s, line_text(s.at.line), &parent),
        Broken::Other => (
            s.at.line,
            s.path.clone(),
            format!("YAML cannot read this line ({})", s.info),
        ),
    };
    Problem {
        line,
        field,
        message: format!("{message}; nothing after it was checked"),
    }
}

/// A line indented so that YAML cannot place it: compared with the key read before it.
fn indentation(s: &Syntax, line: &str, parent: &dyn Fn(&str) -> String) -> (u64, String, String) {
    let key = key_of(line);
    let indent = line.len() - line.trim_start().len();
    let Some((path, at)) = &s.last_key else {
        return (
            s.at.line,
            s.path.clone(),
            "this line's indentation matches nothing above it".into(),
        );
    };
    let sibling = last_key(path);
    let field = yaml::join(&parent(path), &key);
    let message = if at.line == s.at.line || key.is_empty() {
        "this line's indentation matches nothing above it: indent it like the settings it \
         belongs with"
            .to_string()
    } else if indent > at.col {
        format!(
            "`{key}` is indented more than `{sibling}` on line {}, so YAML reads it as part of \
             `{sibling}`'s value: indent it as `{sibling}` is",
            at.line
        )
    } else {
        format!(
            "`{key}` is indented by {indent} spaces, `{sibling}` on line {} by {}: indent it as \
             the settings it belongs with are",
            at.line, at.col
        )
    };
    (s.at.line, field, message)
}

/// The key a line sets (`adress` for `  adress: x`, `id` for `- id: a`).
fn key_of(line: &str) -> String {
    let t = line
        .trim_start_matches([' ', '\t'])
        .trim_start_matches("- ")
        .trim_start();
    t.split_once(':')
        .map_or("", |(k, _)| k)
        .trim()
        .trim_matches(['"', '\''])
        .to_string()
}

/// The name meant by a misspelt `name`: the nearest candidate by edit distance, else one it
/// is the start of (`window` for `window_ms`) or that starts it (`deny` for `deny_commands`).
pub(crate) fn suggest<S: AsRef<str>>(name: &str, candidates: &[S]) -> Option<String> {
    closest(name, candidates).or_else(|| {
        let lower = name.to_ascii_lowercase();
        candidates
            .iter()
            .map(AsRef::as_ref)
            .find(|c| {
                let c = c.to_ascii_lowercase();
                c.starts_with(&format!("{lower}_")) || lower.starts_with(&format!("{c}_"))
            })
            .map(str::to_string)
    })
}

/// The candidate nearest to `name` by edit distance, if near enough to be a typo (a third of
/// its length, at least 1, at most 3 edits).
pub(crate) fn closest<S: AsRef<str>>(name: &str, candidates: &[S]) -> Option<String> {
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
    fn what_a_removal_causes_is_not_reported() {
        // The misspelt `reqests` is removed; `requests` then missing is its consequence.
        let r = recover(
            "rules:\n  - id: a\n    rate_limit:\n      reqests: 1\n      window_ms: 10\n  - deny: [KEYS]\n  - id: c\n    denny: [KEYS]\n",
        );
        let got: Vec<String> = r
            .problems
            .iter()
            .map(|p| format!("{}: {}: {}", p.line, p.field, p.message))
            .collect();
        assert_eq!(got.len(), 3, "{got:#?}");
        assert!(got[0].starts_with("4: rules[0].rate_limit.reqests: unknown setting"));
        assert!(got[1].starts_with("6: rules[1].id: `id` is required here"));
        // The rule after a removed one keeps its number.
        assert!(got[2].starts_with("8: rules[2].denny: unknown setting"));
        assert_eq!(r.original_path("rules[1]"), "rules[2]");
        let rule_a = Problem {
            line: 2,
            field: "rules[0]".into(),
            message: "rule `a` needs exactly one of … (found 0)".into(),
        };
        assert!(r.follows_from_removal(&rule_a));
    }

    #[test]
    fn typos_are_near_and_others_are_not() {
        assert_eq!(
            closest("adress", &["address", "mode"]),
            Some("address".into())
        );
        assert_eq!(closest("KEY", &["keys", "get"]), Some("keys".into()));
        assert_eq!(closest("frobnicate", &["keys", "get"]), None);
        assert_eq!(
            suggest("window", &["requests", "window_ms"]),
            Some("window_ms".into())
        );
        assert_eq!(
            suggest("deny_commands", &["id", "deny", "deny_newer_in"]),
            Some("deny".into())
        );
    }
}
