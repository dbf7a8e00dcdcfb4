//! The `events.lock` format: the schema of every released `(event name, version)`.
//!
//! `#[derive(DomainEvent)]` reads this file at compile time and fails the build when a locked event's
//! fields changed; tests write new entries when `OUTBOX_BLESS=1`. A crate of its own, `std` only, so that the
//! proc-macro crate and the runtime read the file the same way.
//!
//! ```text
//! # events.lock: schemas of released events, checked at compile time by #[derive(DomainEvent)].
//! [order.placed v2]
//! order_id = String
//! total_minor = i64
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The header written at the top of a lock file.
pub const LOCK_FILE_HEADER: &str = "# events.lock: schemas of released events, checked at compile time by \
#[derive(DomainEvent)].\n# Never edit a released entry: bump the event's version and add an upcaster. \
New entries: OUTBOX_BLESS=1 cargo test\n";

/// The fields of one locked event, in declaration order: `(JSON field name, Rust type)`.
pub type LockedFields = Vec<(String, String)>;

/// A parsed lock file: `(name, version)` → fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockFile {
    /// The entries.
    pub entries: BTreeMap<(String, i32), LockedFields>,
}

impl LockFile {
    /// Parses lock-file text; the error names the line.
    pub fn parse(text: &str) -> Result<LockFile, String> {
        let mut lock = LockFile::default();
        let mut current: Option<(String, i32)> = None;
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim();
            let lineno = index + 1;
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                let (name, version) = header
                    .rsplit_once(" v")
                    .ok_or_else(|| format!("line {lineno}: expected `[event.name vN]`, found `{line}`"))?;
                let version: i32 =
                    version.parse().map_err(|_| format!("line {lineno}: `{version}` is not a version number"))?;
                let key = (name.trim().to_owned(), version);
                if lock.entries.insert(key.clone(), Vec::new()).is_some() {
                    return Err(format!("line {lineno}: `{} v{}` appears twice", key.0, key.1));
                }
                current = Some(key);
                continue;
            }
            let (field, ty) = line
                .split_once('=')
                .ok_or_else(|| format!("line {lineno}: expected `field = Type`, found `{line}`"))?;
            let key = current.as_ref().ok_or_else(|| format!("line {lineno}: field before any `[event vN]` header"))?;
            if let Some(fields) = lock.entries.get_mut(key) {
                fields.push((field.trim().to_owned(), ty.trim().to_owned()));
            }
        }
        Ok(lock)
    }

    /// Renders the lock file, entries sorted by name and version.
    pub fn render(&self) -> String {
        let mut out = String::from(LOCK_FILE_HEADER);
        for ((name, version), fields) in &self.entries {
            let _ = write!(out, "\n[{name} v{version}]\n");
            for (field, ty) in fields {
                let _ = writeln!(out, "{field} = {ty}");
            }
        }
        out
    }
}

/// How a schema differs from its locked entry, naming the first field concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaChange {
    /// A field has another type.
    TypeChanged {
        /// The JSON field name.
        field: String,
        /// The type in the lock file.
        locked: String,
        /// The type now.
        now: String,
    },
    /// A field is not in the lock file.
    Added {
        /// The JSON field name.
        field: String,
    },
    /// A locked field is gone.
    Removed {
        /// The JSON field name.
        field: String,
    },
}

impl SchemaChange {
    /// The field concerned.
    pub fn field(&self) -> &str {
        match self {
            SchemaChange::TypeChanged { field, .. }
            | SchemaChange::Added { field }
            | SchemaChange::Removed { field } => field,
        }
    }
}

impl std::fmt::Display for SchemaChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchemaChange::TypeChanged { field, locked, now } => {
                write!(f, "field `{field}` is `{now}` but events.lock has `{locked}`")
            }
            SchemaChange::Added { field } => write!(f, "field `{field}` is not in events.lock"),
            SchemaChange::Removed { field } => {
                write!(f, "field `{field}` is in events.lock but no longer in the struct")
            }
        }
    }
}

/// Compares `now` with `locked` (as sets: JSON field order does not matter).
pub fn compare(locked: &[(String, String)], now: &[(String, String)]) -> Option<SchemaChange> {
    for (field, ty) in now {
        match locked.iter().find(|(f, _)| f == field) {
            None => return Some(SchemaChange::Added { field: field.clone() }),
            Some((_, locked_ty)) if locked_ty != ty => {
                return Some(SchemaChange::TypeChanged {
                    field: field.clone(),
                    locked: locked_ty.clone(),
                    now: ty.clone(),
                });
            }
            Some(_) => {}
        }
    }
    locked
        .iter()
        .find(|(field, _)| !now.iter().any(|(f, _)| f == field))
        .map(|(field, _)| SchemaChange::Removed { field: field.clone() })
}
