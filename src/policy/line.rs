//! The command line as the policy sees it, so each phase reads arguments without caring how
//! the caller stores them.

/// A command line as the policy sees it: argument `i` through a function, so callers keep
/// their own argument storage.
pub trait CommandLine {
    /// Number of arguments, the command name included.
    fn argc(&self) -> usize;
    /// Argument `i` (0 is the command name).
    fn arg(&self, i: usize) -> &[u8];
}

impl<A: AsRef<[u8]>> CommandLine for [A] {
    fn argc(&self) -> usize {
        self.len()
    }
    fn arg(&self, i: usize) -> &[u8] {
        self[i].as_ref()
    }
}
