//! The run-time half of the lock check: [`verify_events_lock`] and [`verify_events_lock_all`] compare event
//! schemas with `events.lock` and, with `OUTBOX_BLESS=1`, add the new ones.

use std::path::{Path, PathBuf};

use super::schema::EventSchema;
use crate::schema_lock::{LockFile, compare, new_detail};

/// One `#[derive(DomainEvent)]` type linked into this binary; the derive submits it.
#[doc(hidden)]
#[derive(Debug)]
pub struct RegisteredEvent {
    /// The lock file the derive checked the event against at compile time (`events.lock` next to the
    /// source or at the crate root; where it would be created when there is none yet).
    pub lock_file: &'static str,
    /// The schema, with those of its `upcast_from` structs.
    pub schema: EventSchema,
}

inventory::collect!(RegisteredEvent);

/// Checks `schemas` (and the `upcast_from` structs each lists) against the lock file at `path`; with
/// `OUTBOX_BLESS=1` in the environment, adds the missing entries instead, creating the file if needed (a
/// locked entry is never changed: a changed schema needs a new version).
///
/// [`verify_events_lock_all`] finds the schemas by itself; this form takes an explicit list:
/// ```no_run
/// # use outbox_runtime::{DomainEvent, EventSchema};
/// # fn schemas() -> Vec<EventSchema> { vec![] }
/// outbox_runtime::verify_events_lock(concat!(env!("CARGO_MANIFEST_DIR"), "/events.lock"), &schemas()).unwrap();
/// ```
///
/// The error lists every problem, each saying what to do.
pub fn verify_events_lock(path: impl AsRef<Path>, schemas: &[EventSchema]) -> std::result::Result<(), String> {
    verify(path.as_ref(), schemas, blessing())
}

/// Checks every `#[derive(DomainEvent)]` type linked into this binary whose lock file is `path` (the derive
/// records which file it checked at compile time), with their `upcast_from` structs; with `OUTBOX_BLESS=1`,
/// adds the missing entries, creating the file if needed. A test is one line:
///
/// ```no_run
/// #[test]
/// fn events_lock() {
///     outbox_runtime::verify_events_lock_all(concat!(env!("CARGO_MANIFEST_DIR"), "/events.lock")).unwrap();
/// }
/// ```
///
/// A test binary links the events declared in its own crate; those of a library it depends on only when
/// the binary uses them. Put the test in the crate that declares the events (a unit test of a library
/// sees all of its events), and run `OUTBOX_BLESS=1 cargo test` after adding one. Generic event types are
/// not registered: list them with [`verify_events_lock`].
pub fn verify_events_lock_all(path: impl AsRef<Path>) -> std::result::Result<(), String> {
    let path = path.as_ref();
    let (schemas, elsewhere) = registered(path);
    if schemas.is_empty() {
        let mut message = if path.exists() {
            format!("no `#[derive(DomainEvent)]` type linked into this binary is locked in {}", path.display())
        } else {
            format!(
                "{} does not exist, and no `#[derive(DomainEvent)]` type linked into this binary names it as its lock file",
                path.display()
            )
        };
        if !elsewhere.is_empty() {
            let _ = std::fmt::Write::write_fmt(&mut message, format_args!(" (they use {})", elsewhere.join(", ")));
        }
        message.push_str(": call this from a test of the crate that declares the events, with its events.lock");
        if !path.exists() {
            message.push_str(", and run `OUTBOX_BLESS=1 cargo test` there to create the file");
        }
        return Err(message);
    }
    verify(path, &schemas, blessing())
}

/// The registered schemas locked in `path`, and the other lock files registered events use.
pub(super) fn registered(path: &Path) -> (Vec<EventSchema>, Vec<String>) {
    let wanted = canonical(path);
    let mut schemas: Vec<EventSchema> = Vec::new();
    let mut elsewhere: Vec<String> = Vec::new();
    for event in inventory::iter::<RegisteredEvent> {
        if canonical(Path::new(event.lock_file)) == wanted {
            schemas.push(event.schema);
        } else if !elsewhere.iter().any(|p| p == event.lock_file) {
            elsewhere.push(event.lock_file.to_owned());
        }
    }
    // Registration order depends on the linker; messages and the written file must not.
    schemas.sort_by(|a, b| (a.name, a.version, a.type_name).cmp(&(b.name, b.version, b.type_name)));
    elsewhere.sort();
    (schemas, elsewhere)
}

/// `path` with symlinks and `..` resolved, also when the file does not exist yet.
fn canonical(path: &Path) -> PathBuf {
    if let Ok(path) = std::fs::canonicalize(path) {
        return path;
    }
    match (path.parent().and_then(|dir| std::fs::canonicalize(dir).ok()), path.file_name()) {
        (Some(dir), Some(name)) => dir.join(name),
        _ => path.to_path_buf(),
    }
}

fn blessing() -> bool {
    std::env::var("OUTBOX_BLESS").is_ok_and(|v| v == "1")
}

/// One entry to check: a version and the struct whose fields it must have.
struct Expected {
    name: &'static str,
    version: i32,
    type_name: &'static str,
    /// The event type, for the `upcast_from` struct of an older version.
    upcast_of: Option<&'static str>,
    lines: Vec<(String, String)>,
}

impl Expected {
    fn describe(&self) -> String {
        match self.upcast_of {
            None => format!("`{} v{}` (`{}`)", self.name, self.version, self.type_name),
            Some(event) => format!(
                "`{} v{}` (`{}`, the `upcast_from` struct of `{event}`)",
                self.name, self.version, self.type_name
            ),
        }
    }

    fn advice(&self) -> String {
        match self.upcast_of {
            None => format!(
                "released events must not change: restore the locked fields, or bump the version to {} and add \
                 `upcast_from(v{} = ...)` with a struct of the locked fields",
                self.version + 1,
                self.version
            ),
            Some(_) => format!(
                "it decodes every stored v{} event, which would then fail to decode: restore its locked fields \
                 (serde renames included)",
                self.version
            ),
        }
    }
}

/// Every version the schemas describe, each once.
fn expected(schemas: &[EventSchema]) -> (Vec<Expected>, Vec<String>) {
    let mut all: Vec<Expected> = Vec::new();
    let mut problems = Vec::new();
    for schema in schemas {
        let older = schema.upcast_from.iter().map(|old| (old, Some(schema.type_name)));
        for (version, upcast_of) in std::iter::once((schema, None)).chain(older) {
            let next = Expected {
                name: version.name,
                version: version.version,
                type_name: version.type_name,
                upcast_of,
                lines: version.lock_lines(),
            };
            match all.iter().find(|e| e.name == next.name && e.version == next.version) {
                Some(seen) if seen.lines == next.lines => {}
                Some(seen) => problems.push(format!(
                    "{} and {} describe the same version with different fields: one of them is wrong",
                    seen.describe(),
                    next.describe()
                )),
                None => all.push(next),
            }
        }
    }
    (all, problems)
}

/// The check itself; `bless` adds what is missing.
pub(super) fn verify(path: &Path, schemas: &[EventSchema], bless: bool) -> std::result::Result<(), String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let (expected, mut problems) = expected(schemas);
    let Some(text) = text.or_else(|| bless.then(String::new)) else {
        return Err(format!(
            "no events.lock at {}: run `OUTBOX_BLESS=1 cargo test` to create it with the schemas of the {} \
             event version(s) this test checks, and commit it",
            path.display(),
            expected.len()
        ));
    };
    let mut lock = LockFile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut changed = false;
    for entry in &expected {
        let key = (entry.name.to_owned(), entry.version);
        match lock.entries.get(&key) {
            Some(locked) => {
                if let Some(change) = compare(locked, &entry.lines) {
                    problems.push(format!(
                        "{} differs from its entry in {}: {change}; {}",
                        entry.describe(),
                        path.display(),
                        entry.advice()
                    ));
                } else if !new_detail(locked, &entry.lines).is_empty() {
                    if bless {
                        // Only lines under fields the entry locked by type alone: nothing locked changes.
                        lock.entries.insert(key, entry.lines.clone());
                        changed = true;
                    } else {
                        let detail: Vec<&str> =
                            new_detail(locked, &entry.lines).iter().map(|(field, _)| field.as_str()).collect();
                        problems.push(format!(
                            "{} has fields of nested types that {} does not lock yet ({}; the entry predates \
                             nested locking): run `OUTBOX_BLESS=1 cargo test` to add them",
                            entry.describe(),
                            path.display(),
                            detail.join(", ")
                        ));
                    }
                }
            }
            None if bless => {
                lock.entries.insert(key, entry.lines.clone());
                changed = true;
            }
            None => problems.push(format!(
                "{} is not in {}; run `OUTBOX_BLESS=1 cargo test` to lock it",
                entry.describe(),
                path.display()
            )),
        }
    }
    if changed {
        std::fs::write(path, lock.render()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("\n")) }
}
