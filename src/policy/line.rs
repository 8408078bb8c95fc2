//! The command line as the policy sees it, so each phase reads arguments without caring how
//! the caller stores them. The trait lives with the argument readers
//! ([`crate::commands::grammar`]), which every rule reads options through.

pub(crate) use crate::commands::grammar::CommandLine;
