//! Compares the event's schema with its entry in the nearest `events.lock`.

use std::path::{Path, PathBuf};

use quote::ToTokens;

use super::ast::Event;
use crate::schema_lock::{LockFile, SchemaChange, compare};

/// The Rust type as written, without spaces: `Option<String>`.
pub fn type_string(ty: &syn::Type) -> String {
    ty.to_token_stream().to_string().replace(' ', "")
}

/// The nearest `events.lock` from the source file's directory up to the crate root (the first directory
/// with a `Cargo.toml`), falling back to `CARGO_MANIFEST_DIR`.
pub fn find_lock_file() -> Option<PathBuf> {
    let source = proc_macro::Span::call_site().local_file();
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
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

pub fn check(event: &Event<'_>) -> syn::Result<()> {
    let (Some(name), Some(version)) = (&event.name, &event.version) else { return Ok(()) };
    let Some(path) = find_lock_file() else { return Ok(()) };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| syn::Error::new(event.attr_span, format!("cannot read {}: {e}", path.display())))?;
    let lock =
        LockFile::parse(&text).map_err(|e| syn::Error::new(event.attr_span, format!("{}: {e}", path.display())))?;
    let version: i32 = version.base10_parse()?;
    let Some(locked) = lock.entries.get(&(name.value(), version)) else { return Ok(()) };
    let now: Vec<(String, String)> =
        event.fields.iter().filter(|f| !f.skipped).map(|f| (f.json_name.clone(), type_string(f.ty))).collect();
    let Some(change) = compare(locked, &now) else { return Ok(()) };
    let span = match &change {
        SchemaChange::Removed { .. } => event.ident.span(),
        other => event
            .fields
            .iter()
            .find(|f| f.json_name == other.field())
            .map(|f| f.ident.span())
            .unwrap_or_else(|| event.ident.span()),
    };
    Err(syn::Error::new(
        span,
        format!(
            "event `{} v{version}` is locked in events.lock and its schema changed: {change}. \
             Released events must not change: bump `version` to {} and add `upcast_from(v{version} = ...)` \
             with the old struct",
            name.value(),
            version + 1
        ),
    ))
}
