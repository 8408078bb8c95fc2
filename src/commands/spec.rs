//! What the table says of a command: its flags, ACL categories, key specs and tips, as
//! [`CommandSpec`] and the flag sets it is made of.

use std::fmt;

// ---------------------------------------------------------------------------------------------
// Flag sets
// ---------------------------------------------------------------------------------------------

/// Defines a copyable bit set with named constants, the names Redis uses for them, and
/// `Debug` output listing the names.
macro_rules! bitset {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident($int:ty);
        $( $(#[$cmeta:meta])* $konst:ident = $bit:expr, $text:literal; )*
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        $vis struct $name(pub(crate) $int);

        impl $name {
            $( $(#[$cmeta])* pub const $konst: $name = $name(1 << $bit); )*

            /// The empty set.
            pub const EMPTY: $name = $name(0);

            /// Every constant with the name Redis uses for it, in bit order.
            pub const NAMES: &'static [($name, &'static str)] = &[ $( ($name::$konst, $text), )* ];

            /// The raw bits (bit positions are this crate's, not Redis's).
            pub const fn bits(self) -> $int {
                self.0
            }

            /// Whether every flag of `other` is set.
            pub const fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether any flag of `other` is set.
            pub const fn intersects(self, other: $name) -> bool {
                self.0 & other.0 != 0
            }

            /// Whether no flag is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }

            /// Both sets together.
            pub const fn union(self, other: $name) -> $name {
                $name(self.0 | other.0)
            }

            /// This set without the flags of `other`.
            pub const fn difference(self, other: $name) -> $name {
                $name(self.0 & !other.0)
            }

            /// The flag Redis calls `name` (ASCII case-insensitive), if there is one.
            pub fn from_name(name: &[u8]) -> Option<$name> {
                Self::NAMES
                    .iter()
                    .find(|(_, n)| n.as_bytes().eq_ignore_ascii_case(name))
                    .map(|(f, _)| *f)
            }

            /// The Redis names of the flags in this set, in bit order.
            pub fn names(self) -> impl Iterator<Item = &'static str> {
                Self::NAMES
                    .iter()
                    .filter(move |(f, _)| self.contains(*f))
                    .map(|(_, n)| *n)
            }
        }

        impl std::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, rhs: $name) -> $name {
                self.union(rhs)
            }
        }

        impl std::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: $name) {
                self.0 |= rhs.0;
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_set().entries(self.names()).finish()
            }
        }
    };
}

bitset! {
    /// Command flags as `COMMAND INFO` reports them (`write`, `readonly`, `blocking`…).
    pub struct CommandFlags(u32);
    /// May modify the dataset.
    WRITE = 0, "write";
    /// Only reads the dataset.
    READONLY = 1, "readonly";
    /// May grow memory use: refused when over `maxmemory`.
    DENYOOM = 2, "denyoom";
    /// Implemented by a module.
    MODULE = 3, "module";
    /// Administrative command (also in `@admin`/`@dangerous`).
    ADMIN = 4, "admin";
    /// Pub/sub command.
    PUBSUB = 5, "pubsub";
    /// Not allowed inside scripts.
    NOSCRIPT = 6, "noscript";
    /// May block the client (BLPOP, XREAD BLOCK, WAIT…).
    BLOCKING = 7, "blocking";
    /// Allowed while the dataset is loading.
    LOADING = 8, "loading";
    /// Allowed on a replica with stale data.
    STALE = 9, "stale";
    /// Not shown in MONITOR.
    SKIP_MONITOR = 10, "skip_monitor";
    /// Not logged in SLOWLOG.
    SKIP_SLOWLOG = 11, "skip_slowlog";
    /// Allowed on a cluster importing slot after ASKING.
    ASKING = 12, "asking";
    /// O(1) or O(log N): never delays the server noticeably.
    FAST = 13, "fast";
    /// Allowed before authentication (AUTH, HELLO).
    NO_AUTH = 14, "no_auth";
    /// Takes key arguments, but may be given none (EVAL with numkeys 0).
    NO_MANDATORY_KEYS = 15, "no_mandatory_keys";
    /// Refused while the dataset is loaded asynchronously.
    NO_ASYNC_LOADING = 16, "no_async_loading";
    /// Refused inside MULTI.
    NO_MULTI = 17, "no_multi";
    /// Key positions depend on the arguments: use [`keys`](super::keys()), not fixed positions.
    MOVABLE_KEYS = 18, "movablekeys";
    /// Allowed while a script or function is busy.
    ALLOW_BUSY = 19, "allow_busy";
}

bitset! {
    /// ACL categories (`@read`, `@dangerous`…), the names without the `@`.
    ///
    /// [`AclCategories::from_name`] also accepts the `@` form, as policies write it.
    pub struct AclCategories(u32);
    /// Touches keys, databases or their metadata generically (DEL, EXPIRE, RENAME…).
    KEYSPACE = 0, "keyspace";
    /// Reads keys.
    READ = 1, "read";
    /// Writes keys.
    WRITE = 2, "write";
    /// Set commands.
    SET = 3, "set";
    /// Sorted set commands.
    SORTEDSET = 4, "sortedset";
    /// List commands.
    LIST = 5, "list";
    /// Hash commands.
    HASH = 6, "hash";
    /// String commands.
    STRING = 7, "string";
    /// Bitmap commands.
    BITMAP = 8, "bitmap";
    /// HyperLogLog commands.
    HYPERLOGLOG = 9, "hyperloglog";
    /// Geospatial commands.
    GEO = 10, "geo";
    /// Stream commands.
    STREAM = 11, "stream";
    /// Pub/sub commands.
    PUBSUB = 12, "pubsub";
    /// Administrative commands.
    ADMIN = 13, "admin";
    /// O(1) or O(log N) commands.
    FAST = 14, "fast";
    /// Every command that is not `@fast`.
    SLOW = 15, "slow";
    /// May block the connection.
    BLOCKING = 16, "blocking";
    /// Potentially dangerous (FLUSHALL, KEYS, CONFIG, DEBUG, SORT…).
    DANGEROUS = 17, "dangerous";
    /// Connection or client management (AUTH, CLIENT, HELLO…).
    CONNECTION = 18, "connection";
    /// MULTI/EXEC/WATCH.
    TRANSACTION = 19, "transaction";
    /// Lua scripts and functions.
    SCRIPTING = 20, "scripting";
}

bitset! {
    /// Key spec flags: how a command accesses a key (see Redis's "key specs" documentation).
    pub struct KeySpecFlags(u16);
    /// Read-only: reads the value, does not modify it.
    RO = 0, "RO";
    /// Read-write: modifies the value or its metadata, and may read it.
    RW = 1, "RW";
    /// Overwrite: replaces the value without reading it.
    OW = 2, "OW";
    /// Remove: deletes the key.
    RM = 3, "RM";
    /// Returns, copies or uses user data from the value.
    ACCESS = 4, "access";
    /// Updates data in the value (new value may depend on the old one).
    UPDATE = 5, "update";
    /// Adds data to the value without changing existing data.
    INSERT = 6, "insert";
    /// Deletes data from the value.
    DELETE = 7, "delete";
    /// Not a key, but routed like one (SPUBLISH channels): never returned by [`keys`](super::keys()).
    NOT_KEY = 8, "not_key";
    /// The spec may miss keys: Redis (and [`keys`](super::keys())) fall back to the command's own procedure.
    INCOMPLETE = 9, "incomplete";
    /// The flags depend on the arguments (SET … GET, BITFIELD GET vs SET).
    VARIABLE_FLAGS = 10, "variable_flags";
}

impl AclCategories {
    /// Like [`AclCategories::from_name`], accepting an optional leading `@` (`@dangerous`).
    pub fn from_category(name: &[u8]) -> Option<AclCategories> {
        let bare = name.strip_prefix(b"@").unwrap_or(name);
        Self::from_name(bare)
    }
}

impl KeySpecFlags {
    /// The flags that say how the key is accessed (everything but the spec's own metadata:
    /// not_key, incomplete, variable_flags).
    const ACCESS_MASK: KeySpecFlags = KeySpecFlags(
        KeySpecFlags::RO.0
            | KeySpecFlags::RW.0
            | KeySpecFlags::OW.0
            | KeySpecFlags::RM.0
            | KeySpecFlags::ACCESS.0
            | KeySpecFlags::UPDATE.0
            | KeySpecFlags::INSERT.0
            | KeySpecFlags::DELETE.0,
    );

    /// Whether the key may be modified (RW, OW or RM).
    pub const fn writes(self) -> bool {
        self.intersects(KeySpecFlags(
            KeySpecFlags::RW.0 | KeySpecFlags::OW.0 | KeySpecFlags::RM.0,
        ))
    }

    #[cfg(test)]
    /// Whether the key's value may be read (RO or RW).
    pub(crate) const fn reads(self) -> bool {
        self.intersects(KeySpecFlags(KeySpecFlags::RO.0 | KeySpecFlags::RW.0))
    }
}

// ---------------------------------------------------------------------------------------------
// Key specs and command specs
// ---------------------------------------------------------------------------------------------

/// Where the search for a key spec's keys starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeginSearch {
    /// At this argument index (the command name is index 0).
    Index(u32),
    /// One past the first argument equal (ASCII case-insensitively) to `keyword`, searching
    /// from `startfrom` towards the end, or from `argc + startfrom` towards the start when
    /// `startfrom` is negative.
    Keyword {
        /// The keyword that precedes the keys (`STREAMS`, `KEYS`, `STORE`).
        keyword: &'static str,
        /// Where the search starts; negative counts from the end.
        startfrom: i32,
    },
    /// Redis cannot tell from the arguments alone; only [`KeysProc`] can.
    Unknown,
}

/// How to find the keys once the search has begun at index `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FindKeys {
    /// Keys from `first` to `last`, every `keystep`-th argument.
    Range {
        /// `last = first + lastkey` when non-negative; otherwise counted from the end
        /// (`argc + lastkey`), or, with a `limit`, `first + (argc - first) / limit + lastkey`.
        lastkey: i32,
        /// Distance between two keys (2 for MSET's key/value pairs).
        keystep: u32,
        /// With a negative `lastkey`: only the first `1/limit` of the remaining arguments are
        /// keys (2 for XREAD: keys, then as many IDs).
        limit: u32,
    },
    /// The number of keys is an argument (EVAL's numkeys).
    Keynum {
        /// Index of the numkeys argument, relative to `first`.
        keynumidx: u32,
        /// Index of the first key, relative to `first`.
        firstkey: u32,
        /// Distance between two keys.
        keystep: u32,
    },
    /// Redis cannot tell from the arguments alone; only [`KeysProc`] can.
    Unknown,
}

/// One key spec: a rule finding some of a command's keys, and how those keys are accessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySpec {
    /// Redis's own explanation, where it gives one (why a spec is unknown, why flags vary).
    pub(crate) notes: &'static str,
    /// How the keys found by this spec are accessed; `NOT_KEY` specs find no keys.
    pub flags: KeySpecFlags,
    /// Where the search starts.
    pub begin_search: BeginSearch,
    /// Which arguments from there are keys.
    pub find_keys: FindKeys,
}

/// A Redis `getkeys_proc`: a C function that finds a command's keys where key specs cannot
/// (or, for SET and BITFIELD, where the keys' flags depend on the arguments).
///
/// Redis reports key specs but not these procedures, so the generator carries the list (from
/// Redis's `src/commands.c`) and refuses to generate a table with a command whose key specs
/// need a procedure it does not know. [`keys`](super::keys()) mirrors each one, bugs included, so that its
/// output matches `COMMAND GETKEYS` exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeysProc {
    /// The key specs are complete: no procedure.
    None,
    /// `zunionInterDiffStoreGetKeys`: destination at 1, numkeys at 2, keys from 3.
    ZunionInterDiffStore,
    /// `zunionInterDiffGetKeys`: numkeys at 1, keys from 2.
    ZunionInterDiff,
    /// `sintercardGetKeys`: numkeys at 1, keys from 2.
    Sintercard,
    /// `evalGetKeys`: numkeys at 2, keys from 3.
    Eval,
    /// `functionGetKeys`: numkeys at 2, keys from 3.
    Function,
    /// `lmpopGetKeys`: numkeys at 1, keys from 2.
    Lmpop,
    /// `blmpopGetKeys`: numkeys at 2 (after the timeout), keys from 3.
    Blmpop,
    /// `zmpopGetKeys`: numkeys at 1, keys from 2.
    Zmpop,
    /// `bzmpopGetKeys`: numkeys at 2 (after the timeout), keys from 3.
    Bzmpop,
    /// `sortGetKeys`: the sorted key, and the last `STORE` destination.
    Sort,
    /// `sortROGetKeys`: the sorted key.
    SortRo,
    /// `migrateGetKeys`: the key at 3, or the keys after `KEYS` when the key at 3 is empty.
    Migrate,
    /// `georadiusGetKeys`: the key, and the last `STORE`/`STOREDIST` destination.
    Georadius,
    /// `xreadGetKeys`: the first half of the arguments after `STREAMS`.
    Xread,
    /// `setGetKeys`: the key, read-write with `GET`, overwritten without.
    Set,
    /// `bitfieldGetKeys`: the key, read-only when only `GET` operations are given.
    Bitfield,
    /// A procedure of the server's that the proxy does not mirror: a command learned from
    /// the server ([`learned`](super::learned)) whose key specs cannot give its keys (unknown, incomplete or
    /// with variable flags). Key extraction fails closed ([`KeyError::Unmirrored`](super::KeyError::Unmirrored)).
    Unmirrored,
}

/// Everything the table knows about one command or subcommand.
#[derive(Debug)]
pub struct CommandSpec {
    /// Lower-case name as Redis reports it; subcommands are `container|sub` (`client|kill`),
    /// the form ACL rules and `COMMAND INFO` use.
    pub name: &'static str,
    /// Redis's arity: `n` means exactly `n` arguments (the name included), `-n` at least `n`.
    pub arity: i32,
    /// Command flags (write, readonly, blocking, movablekeys…).
    pub flags: CommandFlags,
    /// ACL categories, for `@category` allow/deny rules.
    pub acl_categories: AclCategories,
    /// Command tips (`request_policy:all_shards`, `nondeterministic_output`…): how a cluster
    /// router should fan out and merge.
    pub tips: &'static [&'static str],
    /// Key specs, in Redis's order (the order in which [`keys`](super::keys()) reports keys).
    pub key_specs: &'static [KeySpec],
    /// Redis's key-finding procedure for this command, if it has one.
    pub(crate) keys_proc: KeysProc,
    /// Subcommands, sorted by name; empty unless this is a container (CLIENT, CONFIG…).
    pub subcommands: &'static [CommandSpec],
}

impl CommandSpec {
    /// Whether the command may modify the dataset.
    pub const fn is_write(&self) -> bool {
        self.flags.contains(CommandFlags::WRITE)
    }

    /// Whether the command may change the dataset: a write, or a script or function that may
    /// write ([`CommandSpec::runs_writable_script`]).
    pub(crate) fn may_write(&self) -> bool {
        self.is_write() || self.runs_writable_script()
    }

    /// EVAL, EVALSHA and FCALL: Redis does not flag them as writes, yet the script may write
    /// (their `_RO` forms cannot).
    pub(crate) fn runs_writable_script(&self) -> bool {
        matches!(self.name, "eval" | "evalsha" | "fcall")
    }

    /// Whether the command only reads the dataset.
    pub(crate) const fn is_readonly(&self) -> bool {
        self.flags.contains(CommandFlags::READONLY)
    }

    /// Whether the command may block its connection.
    pub const fn is_blocking(&self) -> bool {
        self.flags.contains(CommandFlags::BLOCKING)
    }

    /// Whether the command is administrative.
    pub(crate) const fn is_admin(&self) -> bool {
        self.flags.contains(CommandFlags::ADMIN)
    }

    /// Whether the command is a pub/sub command.
    pub(crate) const fn is_pubsub(&self) -> bool {
        self.flags.contains(CommandFlags::PUBSUB)
    }

    #[cfg(test)]
    /// Whether the command is fast (O(1)/O(log N)).
    pub(crate) const fn is_fast(&self) -> bool {
        self.flags.contains(CommandFlags::FAST)
    }

    /// Whether key positions depend on the arguments (EVAL, XREAD, SORT…).
    pub(crate) const fn has_movable_keys(&self) -> bool {
        self.flags.contains(CommandFlags::MOVABLE_KEYS)
    }

    /// Whether the command is in every category of `categories`.
    pub const fn in_categories(&self, categories: AclCategories) -> bool {
        self.acl_categories.contains(categories)
    }

    /// Whether this is a container whose real commands are its subcommands (CONFIG, CLIENT…).
    pub const fn is_container(&self) -> bool {
        !self.subcommands.is_empty()
    }

    /// The container's name for a subcommand (`client` for `client|kill`), else the name.
    pub(crate) fn container_name(&self) -> &'static str {
        self.name.split_once('|').map_or(self.name, |(c, _)| c)
    }

    /// The subcommand's own name (`kill` for `client|kill`), if this is a subcommand.
    pub(crate) fn subcommand_name(&self) -> Option<&'static str> {
        self.name.split_once('|').map(|(_, s)| s)
    }

    /// Whether the command can take keys at all (Redis's `doesCommandHaveKeys`): a key spec
    /// that finds real keys, or a key procedure. Commands without keys never touch the
    /// keyspace through their arguments (they may still touch it wholesale: FLUSHALL, KEYS).
    pub(crate) fn may_have_keys(&self) -> bool {
        self.keys_proc != KeysProc::None
            || self
                .key_specs
                .iter()
                .any(|s| !s.flags.contains(KeySpecFlags::NOT_KEY))
    }

    /// Every access flag of every key spec: a conservative answer to "how may this command
    /// touch its keys", used for keys whose procedure reports no flags.
    pub fn all_key_flags(&self) -> KeySpecFlags {
        let mut all = KeySpecFlags::EMPTY;
        for s in self.key_specs {
            if !s.flags.contains(KeySpecFlags::NOT_KEY) {
                all |= s.flags;
            }
        }
        KeySpecFlags(all.0 & KeySpecFlags::ACCESS_MASK.0)
    }

    #[cfg(test)]
    /// The value of the tip `name:value` (`request_policy` → `all_shards`), if present.
    pub(crate) fn tip(&self, name: &str) -> Option<&'static str> {
        self.tips
            .iter()
            .find_map(|t| t.strip_prefix(name).and_then(|rest| rest.strip_prefix(':')))
    }

    /// Whether the tips carry the flag-like tip `name` (`nondeterministic_output`).
    pub(crate) fn has_tip(&self, name: &str) -> bool {
        self.tips.contains(&name)
    }
}
