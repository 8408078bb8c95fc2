//! The configuration keys the docs show are the keys the code reads, and every key the code
//! reads is shown somewhere: README.md's config reference and policy/README.md's examples
//! together, against the serde structs of `src/config/` (the rules' in `src/config/rules.rs`).
//!
//! The schema is not written down a second time here: it is asked from the parser itself.
//! Every struct is `deny_unknown_fields`, so a probe key at a path makes serde list the fields
//! the struct there accepts ("unknown field `…`, expected one of `a`, `b`"); a field whose value
//! is itself such a struct (or a list of them) is probed in turn.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

/// The key no struct has, whose rejection lists the ones it does.
const PROBE: &str = "zz_probe";

/// The docs whose YAML blocks document the configuration.
const DOCS: [&str; 2] = ["README.md", "policy/README.md"];

/// One step of a path into the configuration: a mapping key, or "every item of the list".
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Key(String),
    Item,
}

/// `upstream.cluster`, `rules[].ttl`: for messages.
fn show(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(k) if out.is_empty() => out.push_str(k),
            Step::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            Step::Item => out.push_str("[]"),
        }
    }
    if out.is_empty() {
        "(top level)".into()
    } else {
        out
    }
}

/// YAML text that puts `leaf` (a YAML value) at `path`.
fn yaml_at(path: &[Step], leaf: &str) -> String {
    let mut out = String::new();
    let mut indent = 0;
    for (i, step) in path.iter().enumerate() {
        let pad = " ".repeat(indent);
        let last = i + 1 == path.len();
        match step {
            Step::Key(k) if last => out.push_str(&format!("{pad}{k}: {leaf}\n")),
            Step::Key(k) => out.push_str(&format!("{pad}{k}:\n")),
            Step::Item if last => out.push_str(&format!("{pad}- {leaf}\n")),
            Step::Item => {
                // The next key goes on the dash's line, indented past it.
                out.push_str(&format!("{pad}-\n"));
            }
        }
        indent += 2;
    }
    if path.is_empty() {
        out.push_str(leaf);
        out.push('\n');
    }
    out
}

/// The fields of the struct at `path`, if a struct is there: the parser's own list.
fn fields_at(path: &[Step]) -> Option<BTreeSet<String>> {
    let mut probe = path.to_vec();
    probe.push(Step::Key(PROBE.into()));
    let text = yaml_at(&probe, "1");
    let err = match redis_policy_proxy::Config::parse(&text, Path::new("probe.yaml")) {
        Ok(_) => return None,
        Err(e) => e.to_string(),
    };
    let at = err.find(&format!("unknown field `{PROBE}`, expected one of "))?;
    let list = &err[at..];
    let list = &list[list.find("expected one of ").unwrap() + "expected one of ".len()..];
    let list = list.lines().next().unwrap_or("");
    Some(
        list.split(", ")
            .map(|f| f.trim().trim_matches('`').to_string())
            .filter(|f| !f.is_empty())
            .collect(),
    )
}

/// What the parser accepts: the fields of every struct, by path; a field is nested when its
/// path is a key too (`Item` steps for lists of structs).
fn schema() -> BTreeMap<Vec<Step>, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        let fields = fields_at(&path).unwrap_or_else(|| panic!("no struct at {}", show(&path)));
        for f in &fields {
            let mut child = path.clone();
            child.push(Step::Key(f.clone()));
            if fields_at(&child).is_some() {
                todo.push(child);
                continue;
            }
            let mut item = child.clone();
            item.push(Step::Item);
            if fields_at(&item).is_some() {
                todo.push(item);
            }
        }
        out.insert(path, fields);
    }
    out
}

/// The ```yaml blocks of a Markdown file.
fn yaml_blocks(file: &str) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line.trim_start()) {
            (None, l) if l.starts_with("```yaml") => current = Some(String::new()),
            (Some(_), l) if l.starts_with("```") => blocks.extend(current.take()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// A documented block as a whole configuration: a mapping is one as it stands; a list is a
/// `rules:` excerpt (the rule examples of policy/README.md).
fn as_config(block: &str) -> (Value, String) {
    let value: Value = serde_saphyr::from_str(block).unwrap_or_else(|e| panic!("{e}:\n{block}"));
    match value {
        Value::Array(_) => {
            let indented: String = block.lines().map(|l| format!("  {l}\n")).collect();
            let text = format!("rules:\n{indented}");
            (serde_saphyr::from_str(&text).unwrap(), text)
        }
        _ => (value, block.to_string()),
    }
}

/// Walks a documented value along the schema: every key it uses must be a field there.
/// Records each documented field as `(struct path, field)`.
fn walk(
    value: &Value,
    path: &[Step],
    schema: &BTreeMap<Vec<Step>, BTreeSet<String>>,
    documented: &mut BTreeSet<(Vec<Step>, String)>,
    unknown: &mut Vec<String>,
    file: &str,
) {
    let Some(fields) = schema.get(path) else {
        return;
    };
    let Value::Object(map) = value else {
        return;
    };
    for (key, child) in map {
        if !fields.contains(key) {
            unknown.push(format!("{file}: `{key}` under {}", show(path)));
            continue;
        }
        documented.insert((path.to_vec(), key.clone()));
        let mut next = path.to_vec();
        next.push(Step::Key(key.clone()));
        if schema.contains_key(&next) {
            walk(child, &next, schema, documented, unknown, file);
        }
        next.push(Step::Item);
        if let (true, Value::Array(items)) = (schema.contains_key(&next), child) {
            for item in items {
                walk(item, &next, schema, documented, unknown, file);
            }
        }
    }
}

#[test]
fn documented_config_keys_match_the_schema_both_ways() {
    let schema = schema();
    // The probe found the nesting the docs use.
    for path in [
        "upstream",
        "upstream.cluster",
        "rules[]",
        "rules[].ttl",
        "access",
    ] {
        assert!(
            schema.keys().any(|p| show(p) == path),
            "{path} not found: {:?}",
            schema.keys().map(|p| show(p)).collect::<Vec<_>>()
        );
    }

    let mut documented = BTreeSet::new();
    let mut unknown = Vec::new();
    for file in DOCS {
        for block in yaml_blocks(file) {
            let (value, text) = as_config(&block);
            // The block must also parse as a configuration (types too, not only names).
            if let Err(e) = redis_policy_proxy::Config::parse(&text, Path::new(file)) {
                unknown.push(format!("{file}: a block does not parse: {e}\n{block}"));
            }
            walk(&value, &[], &schema, &mut documented, &mut unknown, file);
        }
    }
    assert!(
        unknown.is_empty(),
        "documented but not in the schema:\n{}",
        unknown.join("\n")
    );

    let missing: Vec<String> = schema
        .iter()
        .flat_map(|(path, fields)| fields.iter().map(move |f| (path, f)))
        .filter(|(path, f)| !documented.contains(&(path.to_vec(), f.to_string())))
        // `mirror.upstream` is configured as `upstream:` is (its keys are documented there).
        .filter(|(path, f)| {
            let mirrored = [Step::Key("mirror".into()), Step::Key("upstream".into())];
            match path.strip_prefix(&mirrored[..]) {
                Some(rest) => {
                    let mut same = vec![Step::Key("upstream".into())];
                    same.extend(rest.iter().cloned());
                    !documented.contains(&(same, f.to_string()))
                }
                None => true,
            }
        })
        .map(|(path, f)| match path.is_empty() {
            true => f.to_string(),
            false => format!("{}.{f}", show(path)),
        })
        .collect();
    assert!(
        missing.is_empty(),
        "in the schema but in no YAML block of {DOCS:?}: {missing:#?}"
    );
}

#[test]
fn the_probe_reads_the_parsers_field_list() {
    let top = fields_at(&[]).expect("the top level is a struct");
    for key in ["listen", "upstream", "limits", "rules", "access", "admin"] {
        assert!(top.contains(key), "{top:?}");
    }
    // `version` is computed, never read.
    assert!(!top.contains("version"), "{top:?}");
    assert!(fields_at(&[Step::Key("listen".into())]).is_none());

    // A documented key the schema lacks is reported, however deep.
    let (value, _) =
        as_config("upstream:\n  adress: x\nrules:\n  - id: r\n    ttl: {defualt: 1h}\n");
    let (mut documented, mut unknown) = (BTreeSet::new(), Vec::new());
    walk(&value, &[], &schema(), &mut documented, &mut unknown, "t");
    unknown.sort();
    assert_eq!(
        unknown,
        [
            "t: `adress` under upstream",
            "t: `defualt` under rules[].ttl"
        ]
    );
}
