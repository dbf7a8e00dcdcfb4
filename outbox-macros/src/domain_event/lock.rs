//! Compares the event's schema with its entries in the nearest `events.lock`.
//!
//! What the derive sees (the event's own fields) is compared here, with an error on the changed field.
//! What it cannot see (the fields of nested types and of `upcast_from` structs) is compared by the code
//! [`super::expand`] generates from [`Lock::entry`]: a `const` that fails the build on a drift.

use std::path::{Path, PathBuf};

use quote::ToTokens;

use super::ast::Event;
use crate::schema_lock::{LockFile, LockedFields, LockedNode, SchemaChange, compare, normalize_type, tree};

/// The Rust type in its short form, as the lock file records it: `Option<String>`.
pub fn type_string(ty: &syn::Type) -> String {
    normalize_type(&ty.to_token_stream().to_string())
}

/// The nearest `events.lock` from the source file's directory up to the crate root (the first directory
/// with a `Cargo.toml`), falling back to `CARGO_MANIFEST_DIR`.
pub fn find_lock_file() -> Option<PathBuf> {
    let source = proc_macro::Span::call_site().local_file();
    let manifest_dir = manifest_dir();
    let start = source
        .as_deref()
        .and_then(Path::parent)
        .map(|dir| match (&manifest_dir, dir.is_relative()) {
            (Some(root), true) => root.join(dir),
            _ => dir.to_path_buf(),
        })
        .or_else(|| manifest_dir.clone())?;
    let mut dir = Some(start.as_path());
    while let Some(current) = dir {
        let candidate = current.join("events.lock");
        if candidate.is_file() {
            return Some(candidate);
        }
        if current.join("Cargo.toml").is_file() {
            break;
        }
        dir = current.parent();
    }
    manifest_dir.map(|d| d.join("events.lock")).filter(|p| p.is_file())
}

fn manifest_dir() -> Option<PathBuf> {
    std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from)
}

/// The lock file of this event: where it is, and its entries when it exists.
pub struct Lock {
    /// The file the event is checked against, or where `OUTBOX_BLESS=1 cargo test` creates it (the crate
    /// root).
    pub path: PathBuf,
    /// Whether the file exists (the build then tracks it).
    pub exists: bool,
    file: LockFile,
}

impl Lock {
    /// Reads the nearest lock file; no file is no error (the lock test says how to create it).
    pub fn load(event: &Event<'_>) -> syn::Result<Lock> {
        let Some(path) = find_lock_file() else {
            let path = manifest_dir().unwrap_or_default().join("events.lock");
            return Ok(Lock { path, exists: false, file: LockFile::default() });
        };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| syn::Error::new(event.attr_span, format!("cannot read {}: {e}", path.display())))?;
        let file =
            LockFile::parse(&text).map_err(|e| syn::Error::new(event.attr_span, format!("{}: {e}", path.display())))?;
        Ok(Lock { path, exists: true, file })
    }

    /// The locked entry of `name vN`, as a tree.
    pub fn entry(&self, name: &str, version: i32) -> Option<Vec<LockedNode>> {
        self.locked(name, version).map(|fields| tree(fields))
    }

    fn locked(&self, name: &str, version: i32) -> Option<&LockedFields> {
        self.file.entries.get(&(name.to_owned(), version))
    }

    /// Compares the event's own fields with the top level of its entry; the error is on the changed field.
    pub fn check_fields(&self, event: &Event<'_>) -> syn::Result<()> {
        let (Some(name), Some(version)) = (&event.name, &event.version) else { return Ok(()) };
        let version: i32 = version.base10_parse()?;
        let Some(entry) = self.entry(&name.value(), version) else { return Ok(()) };
        // Nested lines are the generated code's to compare.
        let locked: Vec<(String, String)> = entry.into_iter().map(|node| (node.name, node.ty)).collect();
        let now: Vec<(String, String)> =
            event.fields.iter().filter(|f| !f.skipped).map(|f| (f.json_name.clone(), type_string(f.ty))).collect();
        let Some(change) = compare(&locked, &now) else { return Ok(()) };
        let span = match &change {
            SchemaChange::Removed { .. } => event.ident.span(),
            other => event
                .fields
                .iter()
                .find(|f| f.json_name == other.field())
                .map(|f| f.span())
                .unwrap_or_else(|| event.ident.span()),
        };
        let name = name.value();
        Err(syn::Error::new(
            span,
            format!(
                "event `{name} v{version}` does not match its entry in events.lock: {change}. {}",
                released_advice(version)
            ),
        ))
    }
}

/// What to do about a locked event whose schema (or a type inside it) changed.
pub fn released_advice(version: i32) -> String {
    format!(
        "A released event must not change, nor the types it holds: restore the locked fields, or bump `version` \
         to {} and add `upcast_from(v{version} = ...)` with a struct of the locked fields. If v{version} was never \
         released, delete its entry from events.lock and lock it anew with `OUTBOX_BLESS=1 cargo test`",
        version + 1
    )
}
