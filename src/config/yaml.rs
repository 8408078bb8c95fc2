//! The lenient reading of a policy file: its YAML as a tree of keys, list items and values,
//! each with where it is written, whatever the schema says. The strict reading (serde into
//! [`Config`](super::Config)) says what is wrong; this one says where: the line of a key,
//! the path of the value at a parser's error location (`rules[2].ttl.max`), which keys are
//! given twice, and, when the YAML itself is broken, what was open at the point it broke.

use std::collections::BTreeMap;

use serde_saphyr::granit_parser::{Event, Marker, Parser, ScanError, StructureStyle};

/// A place in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Pos {
    /// 1-based line.
    pub(crate) line: u64,
    /// 0-based column, in characters.
    pub(crate) col: usize,
    /// Byte offset in the text.
    pub(crate) byte: usize,
}

/// A node of the YAML tree.
#[derive(Debug)]
pub(crate) struct Node {
    /// What it is.
    pub(crate) kind: Kind,
    /// Where it begins (a block list: its first `-`).
    pub(crate) start: Pos,
    /// Just past its last character (a block collection: past its last child's).
    pub(crate) end: Pos,
}

/// The kinds of node.
#[derive(Debug)]
pub(crate) enum Kind {
    /// A single value, as YAML read it (quotes and escapes resolved).
    Scalar(String),
    /// A list.
    Seq {
        /// Its items.
        items: Vec<Node>,
        /// Written `[a, b]` rather than one `- ` line per item.
        flow: bool,
    },
    /// Settings: `key: value` entries.
    Map {
        /// Its entries, in file order, duplicates included.
        entries: Vec<(Node, Node)>,
        /// Written `{a: 1}` rather than one line per entry.
        flow: bool,
    },
    /// `*name`.
    Alias,
}

impl Node {
    /// The text of a scalar (the key of an entry); empty for anything else.
    pub(crate) fn text(&self) -> &str {
        match &self.kind {
            Kind::Scalar(s) => s,
            _ => "",
        }
    }

    /// Whether it is YAML's null: nothing written (`key:` alone), `~` or `null`.
    pub(crate) fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar(s) if s.is_empty() || s == "~" || s == "null")
    }

    /// In the operator's words: `` `KEYS` ``, "a list", "settings (`key: value`)", "nothing".
    pub(crate) fn describe(&self) -> String {
        match &self.kind {
            _ if self.is_null() => "nothing".into(),
            Kind::Scalar(s) => format!("`{s}`"),
            Kind::Seq { .. } => "a list".into(),
            Kind::Map { .. } => "settings (`key: value`)".into(),
            Kind::Alias => "an alias".into(),
        }
    }

    /// Whether it is a list or settings written in flow style (`[…]`, `{…}`).
    pub(crate) fn is_flow(&self) -> bool {
        matches!(
            self.kind,
            Kind::Seq { flow: true, .. } | Kind::Map { flow: true, .. }
        )
    }

    /// How many entries or items it holds (0 for a scalar).
    pub(crate) fn len(&self) -> usize {
        match &self.kind {
            Kind::Seq { items, .. } => items.len(),
            Kind::Map { entries, .. } => entries.len(),
            _ => 0,
        }
    }
}

/// One place a value can be written: a map entry (`key: value`) or a list item.
#[derive(Debug)]
pub(crate) struct Slot<'a> {
    /// Its path: `upstream.address`, `rules[2]`, `rules[2].ttl.max`.
    pub(crate) path: String,
    /// The line of its key, or of its item.
    pub(crate) line: u64,
    /// The key, for a map entry.
    pub(crate) key: Option<&'a Node>,
    /// The value.
    pub(crate) value: &'a Node,
    /// The collection holding it.
    pub(crate) parent: &'a Node,
    /// Its index in `parent`.
    pub(crate) index: usize,
}

/// The file's YAML, read leniently.
#[derive(Debug)]
pub(crate) struct Tree {
    /// The document; `None` for an empty file.
    pub(crate) root: Option<Node>,
}

/// Why the YAML itself could not be read, and what was open at the point it broke.
#[derive(Debug)]
pub(crate) struct Syntax {
    /// Where the parser stopped.
    pub(crate) at: Pos,
    /// The parser's category.
    pub(crate) kind: Broken,
    /// The parser's own message (for anything [`Broken::Other`]).
    pub(crate) info: String,
    /// The path being read when it broke (`upstream.address`: the value of `address`).
    pub(crate) path: String,
    /// The innermost `[` or `{` still open, with its path and where it was opened.
    pub(crate) open_flow: Option<(String, Pos, char)>,
    /// The last key read before it broke: its path and where it is.
    pub(crate) last_key: Option<(String, Pos)>,
    /// The last scalar read before it broke: where it began and ended.
    pub(crate) last_scalar: Option<(Pos, Pos)>,
}

/// The kinds of broken YAML an operator writes, by cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Broken {
    /// A tab in the indentation.
    Tab,
    /// A quote never closed.
    UnclosedQuote,
    /// A `[` or `{` never closed.
    UnclosedBracket,
    /// A `key:` where YAML reads the text as part of the value before it (`key:` indented
    /// deeper than the line above, or a `key:value` without a space).
    ValueContinues,
    /// A line indented so that it belongs to nothing above it.
    Indentation,
    /// Anything else.
    Other,
}

/// A collection being read.
enum Frame {
    Seq {
        start: Pos,
        flow: bool,
        items: Vec<Node>,
    },
    Map {
        start: Pos,
        flow: bool,
        entries: Vec<(Node, Node)>,
        key: Option<Node>,
    },
}

impl Tree {
    /// Reads `text`; `Err` when it is not YAML.
    pub(crate) fn parse(text: &str) -> Result<Tree, Box<Syntax>> {
        let bytes = CharBytes::new(text);
        let pos = |m: &Marker| Pos {
            line: m.line() as u64,
            col: m.col(),
            byte: m.byte_offset().unwrap_or_else(|| bytes.of(m.index())),
        };
        let mut stack: Vec<Frame> = Vec::new();
        let mut root = None;
        let mut last_key: Option<(String, Pos)> = None;
        let mut last_scalar = None;
        for event in Parser::new_from_str(text) {
            let (event, span) = match event {
                Ok(e) => e,
                Err(e) => {
                    return Err(Box::new(broken(
                        &e,
                        pos(e.marker()),
                        &stack,
                        last_key,
                        last_scalar,
                    )));
                }
            };
            let (start, end) = (pos(&span.start), pos(&span.end));
            let node = match event {
                Event::Scalar(value, ..) => {
                    last_scalar = Some((start, end));
                    Some(Node {
                        kind: Kind::Scalar(value.into_owned()),
                        start,
                        end,
                    })
                }
                Event::Alias(_) => Some(Node {
                    kind: Kind::Alias,
                    start,
                    end,
                }),
                Event::SequenceStart(style, ..) => {
                    stack.push(Frame::Seq {
                        start,
                        flow: style == StructureStyle::Flow,
                        items: Vec::new(),
                    });
                    None
                }
                Event::MappingStart(style, ..) => {
                    stack.push(Frame::Map {
                        start,
                        flow: style == StructureStyle::Flow,
                        entries: Vec::new(),
                        key: None,
                    });
                    None
                }
                Event::SequenceEnd | Event::MappingEnd => stack.pop().map(|frame| match frame {
                    Frame::Seq { start, flow, items } => Node {
                        end: if flow {
                            end
                        } else {
                            items.last().map_or(start, |n| n.end)
                        },
                        kind: Kind::Seq { items, flow },
                        start,
                    },
                    Frame::Map {
                        start,
                        flow,
                        entries,
                        ..
                    } => Node {
                        end: if flow {
                            end
                        } else {
                            entries.last().map_or(start, |(_, v)| v.end)
                        },
                        kind: Kind::Map { entries, flow },
                        start,
                    },
                }),
                _ => None,
            };
            let Some(node) = node else { continue };
            let mut read_key = None;
            match stack.last_mut() {
                // The first document is the file's (as the strict reading takes it).
                None if root.is_some() => {}
                None => root = Some(node),
                Some(Frame::Seq { items, .. }) => items.push(node),
                Some(Frame::Map { entries, key, .. }) => match key.take() {
                    Some(k) => entries.push((k, node)),
                    None => {
                        read_key = Some(node.start);
                        *key = Some(node);
                    }
                },
            }
            if let Some(at) = read_key {
                last_key = Some((path_of(&stack), at));
            }
        }
        Ok(Tree { root })
    }

    /// Every entry and item, parents before children.
    pub(crate) fn slots(&self) -> Vec<Slot<'_>> {
        let mut out = Vec::new();
        if let Some(root) = &self.root {
            collect(root, "", &mut out);
        }
        out
    }

    /// The line of every key and item, by path.
    pub(crate) fn lines(&self) -> BTreeMap<String, u64> {
        self.slots().into_iter().map(|s| (s.path, s.line)).collect()
    }

    /// Keys given twice in one mapping: the later one's path and position, and the first
    /// one's line.
    pub(crate) fn duplicates(&self) -> Vec<(String, Pos, u64)> {
        let mut out = Vec::new();
        let root_dups = self.root.as_ref().map(|r| dups_in(r, ""));
        out.extend(root_dups.into_iter().flatten());
        for slot in self.slots() {
            out.extend(dups_in(slot.value, &slot.path));
        }
        out.sort_by_key(|d| d.1.line);
        out
    }

    /// The entry whose key begins at `line`, `col` (0-based).
    pub(crate) fn key_at(&self, line: u64, col: usize) -> Option<Slot<'_>> {
        self.slots().into_iter().find(|s| {
            s.key
                .is_some_and(|k| k.start.line == line && k.start.col == col)
        })
    }

    /// The deepest entry or item whose value begins at `line`, `col` (0-based); else the
    /// deepest one on that line.
    pub(crate) fn value_at(&self, line: u64, col: usize) -> Option<Slot<'_>> {
        let slots = self.slots();
        let exact = slots
            .iter()
            .rposition(|s| s.value.start.line == line && s.value.start.col == col);
        let on_line = || {
            slots
                .iter()
                .rposition(|s| s.key.map_or(s.value.start.line, |k| k.start.line) == line)
        };
        let i = exact.or_else(on_line)?;
        slots.into_iter().nth(i)
    }

    /// The entry or item whose value is the mapping holding the key at `line`, `col`, or
    /// beginning there; `None` for the top level.
    pub(crate) fn owner_of_key_at(&self, line: u64, col: usize) -> Option<Slot<'_>> {
        let at = |n: &Node| n.start.line == line && n.start.col == col;
        self.slots()
            .into_iter()
            .rev()
            .find(|s| match &s.value.kind {
                Kind::Map { entries, .. } => at(s.value) || entries.iter().any(|(k, _)| at(k)),
                _ => false,
            })
    }
}

/// The entries and items of `node` under `path`, depth first.
fn collect<'a>(node: &'a Node, path: &str, out: &mut Vec<Slot<'a>>) {
    match &node.kind {
        Kind::Map { entries, .. } => {
            for (index, (key, value)) in entries.iter().enumerate() {
                let p = join(path, key.text());
                out.push(Slot {
                    path: p.clone(),
                    line: key.start.line,
                    key: Some(key),
                    value,
                    parent: node,
                    index,
                });
                collect(value, &p, out);
            }
        }
        Kind::Seq { items, .. } => {
            for (index, item) in items.iter().enumerate() {
                let p = format!("{path}[{index}]");
                out.push(Slot {
                    path: p.clone(),
                    line: item.start.line,
                    key: None,
                    value: item,
                    parent: node,
                    index,
                });
                collect(item, &p, out);
            }
        }
        _ => {}
    }
}

fn dups_in(node: &Node, path: &str) -> Vec<(String, Pos, u64)> {
    let mut out = Vec::new();
    if let Kind::Map { entries, .. } = &node.kind {
        let mut seen: BTreeMap<&str, u64> = BTreeMap::new();
        for (key, _) in entries {
            match seen.get(key.text()) {
                Some(&first) => out.push((join(path, key.text()), key.start, first)),
                None => {
                    seen.insert(key.text(), key.start.line);
                }
            }
        }
    }
    out
}

/// `parent.key`, or `key` at the top.
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// The path being read: each open mapping's pending key, each open list's next index.
fn path_of(stack: &[Frame]) -> String {
    let mut path = String::new();
    for frame in stack {
        match frame {
            Frame::Seq { items, .. } => path.push_str(&format!("[{}]", items.len())),
            Frame::Map { key: Some(k), .. } => path = join(&path, k.text()),
            Frame::Map { key: None, .. } => {}
        }
    }
    path
}

fn broken(
    e: &ScanError,
    at: Pos,
    stack: &[Frame],
    last_key: Option<(String, Pos)>,
    last_scalar: Option<(Pos, Pos)>,
) -> Syntax {
    use serde_saphyr::granit_parser::ErrorKind as K;
    let open_flow = stack.iter().enumerate().rev().find_map(|(i, f)| match f {
        Frame::Seq {
            start, flow: true, ..
        } => Some((path_of(&stack[..i]), *start, '[')),
        Frame::Map {
            start, flow: true, ..
        } => Some((path_of(&stack[..i]), *start, '{')),
        _ => None,
    });
    let kind = match e.kind() {
        K::TabInBlockIndentation | K::TabInIndentation | K::TabNotAllowed => Broken::Tab,
        K::UnclosedQuotedScalar => Broken::UnclosedQuote,
        K::UnexpectedEofFlowSequence
        | K::UnexpectedEofFlowMapping
        | K::UnexpectedEofImplicitFlowMapping
        | K::UnclosedFlowCollection { .. } => Broken::UnclosedBracket,
        _ if open_flow.as_ref().is_some_and(|(_, p, _)| p.line < at.line) => {
            Broken::UnclosedBracket
        }
        K::MappingValueNotAllowed => Broken::ValueContinues,
        K::ExpectedBlockSequenceEntry
        | K::ExpectedBlockMappingKey
        | K::InvalidIndentation
        | K::UnexpectedEofBlockMapping
        | K::UnexpectedEofBlockSequence => Broken::Indentation,
        _ => Broken::Other,
    };
    Syntax {
        at,
        kind,
        info: e.info(),
        path: path_of(stack),
        open_flow,
        last_key,
        last_scalar,
    }
}

/// Character index to byte offset, for markers without a byte offset.
struct CharBytes(Vec<usize>);

impl CharBytes {
    fn new(text: &str) -> CharBytes {
        if text.is_ascii() {
            return CharBytes(Vec::new());
        }
        CharBytes(text.char_indices().map(|(b, _)| b).collect())
    }

    fn of(&self, index: usize) -> usize {
        if self.0.is_empty() {
            index
        } else {
            self.0.get(index).copied().unwrap_or(usize::MAX)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_lines_of_keys_and_items() {
        let t = Tree::parse(
            "upstream:\n  address: a:1\nrules:\n  - id: x\n    ttl: {default: 1h, prefixes: [{prefix: a, ttl: 1m}]}\n- bad\n",
        );
        // A list item at the top level after a mapping is broken YAML.
        assert!(t.is_err());
        let t = Tree::parse(
            "upstream:\n  address: a:1\nrules:\n  - id: x\n    ttl: {default: 1h, prefixes: [{prefix: a, ttl: 1m}]}\n  - id: y\n    deny:\n      - KEYS\n",
        )
        .unwrap();
        let lines = t.lines();
        for (path, line) in [
            ("upstream.address", 2),
            ("rules", 3),
            ("rules[0]", 4),
            ("rules[0].ttl.prefixes[0].ttl", 5),
            ("rules[1].deny", 7),
            ("rules[1].deny[0]", 8),
        ] {
            assert_eq!(lines.get(path), Some(&line), "{path}: {lines:?}");
        }
        let s = t.value_at(8, 8).unwrap();
        assert_eq!(s.path, "rules[1].deny[0]");
        let s = t.key_at(5, 23).unwrap();
        assert_eq!(s.path, "rules[0].ttl.prefixes");
        let s = t.owner_of_key_at(5, 35).unwrap();
        assert_eq!(s.path, "rules[0].ttl.prefixes[0]");
    }

    #[test]
    fn duplicates_name_both_lines() {
        let t = Tree::parse("upstream:\n  address: a\n  connections: 1\n  address: b\n").unwrap();
        let d: Vec<(String, u64, u64)> = t
            .duplicates()
            .into_iter()
            .map(|(p, at, first)| (p, at.line, first))
            .collect();
        assert_eq!(d, [("upstream.address".to_string(), 4, 2)]);
    }

    #[test]
    fn broken_yaml_says_what_was_open() {
        let e = Tree::parse("rules:\n  - id: a\n    deny: [KEYS, FLUSHALL\n    message: m\n")
            .unwrap_err();
        assert_eq!(e.kind, Broken::UnclosedBracket);
        let (path, at, c) = e.open_flow.clone().unwrap();
        assert_eq!((path.as_str(), at.line, c), ("rules[0].deny", 3, '['));
        let e = Tree::parse("upstream:\n\taddress: a\n").unwrap_err();
        assert_eq!((e.kind, e.at.line), (Broken::Tab, 2));
        let e = Tree::parse("a:\n  b: 1\n    c: 2\n").unwrap_err();
        let key = e.last_key.as_ref().map(|(p, at)| (p.as_str(), at.line));
        assert_eq!((e.kind, key), (Broken::ValueContinues, Some(("a.b", 2))));
    }
}
