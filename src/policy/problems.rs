//! Where a rule's compile problems go, with the field and line each names.

use crate::config::Problem;

/// Where one rule's problems go: the list, the rule's field (`rules[3]`) and its line.
pub(super) struct Problems<'a> {
    /// Every problem of the file so far.
    pub(super) list: &'a mut Vec<Problem>,
    /// `rules[<index>]`, the prefix of every field named.
    pub(super) field: String,
    /// The rule's `id:` line, for problems without a line of their own.
    pub(super) line: u64,
}

impl Problems<'_> {
    /// A problem at `field` (under the rule's) on `line`.
    pub(super) fn push(&mut self, field: &str, line: u64, message: String) {
        let field = if field.is_empty() {
            self.field.clone()
        } else {
            format!("{}.{field}", self.field)
        };
        self.list.push(Problem {
            line,
            field,
            message,
        });
    }
}
