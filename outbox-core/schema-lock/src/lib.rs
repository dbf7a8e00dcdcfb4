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
//! shipping = Option<Address>
//! shipping.street = String
//! shipping.zip = String
//! ```
//!
//! Each line is `field = Type`: the JSON field name (serde renames applied) and the Rust type in its short
//! form ([`normalize_type`]). A line `field.sub = Type` is a field of the struct (or a variant of the enum)
//! inside `field`'s type, looked through `Option`, `Vec`, `Box`, maps and the like; it follows its parent.
//! An entry whose `field` has no such lines (written before nested types were locked, or a type locked by
//! name only) still matches: the lines under it are new detail, see [`new_detail`].

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
        /// The field's path (`address.zip` for a field of a nested type).
        field: String,
        /// The type in the lock file.
        locked: String,
        /// The type now.
        now: String,
    },
    /// A field is not in the lock file.
    Added {
        /// The field's path.
        field: String,
    },
    /// A locked field is gone.
    Removed {
        /// The field's path.
        field: String,
    },
}

impl SchemaChange {
    /// The path of the field concerned.
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

/// Compares `now` with `locked` (as sets: field order does not matter; types by [`normalize_type`]).
///
/// The lines of `now` that [`new_detail`] returns are not compared: the entry locked their parent by name.
pub fn compare(locked: &[(String, String)], now: &[(String, String)]) -> Option<SchemaChange> {
    for (field, ty) in now {
        match locked.iter().find(|(f, _)| f == field) {
            None if is_new_detail(locked, field) => {}
            None => return Some(SchemaChange::Added { field: field.clone() }),
            Some((_, locked_ty)) if normalize_type(locked_ty) != normalize_type(ty) => {
                return Some(SchemaChange::TypeChanged {
                    field: field.clone(),
                    locked: locked_ty.clone(),
                    now: normalize_type(ty),
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

/// The lines of `now` under a locked field that has no lines of its own in `locked`: an entry written
/// before nested types were locked (or while the type was locked by name only). They match, and blessing
/// adds them to the entry.
pub fn new_detail<'a>(locked: &[(String, String)], now: &'a [(String, String)]) -> Vec<&'a (String, String)> {
    now.iter().filter(|(field, _)| !locked.iter().any(|(f, _)| f == field) && is_new_detail(locked, field)).collect()
}

/// Whether `field` lies under a locked path that `locked` has no nested lines for.
fn is_new_detail(locked: &[(String, String)], field: &str) -> bool {
    let mut path = field;
    while let Some((parent, _)) = path.rsplit_once('.') {
        if locked.iter().any(|(f, _)| f == parent) {
            let prefix = format!("{parent}.");
            return !locked.iter().any(|(f, _)| f.starts_with(&prefix));
        }
        path = parent;
    }
    false
}

/// One locked field with the fields of its type, as [`tree`] builds them from the flat lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockedNode {
    /// The field's own name (the last segment of its path).
    pub name: String,
    /// The type, as locked.
    pub ty: String,
    /// The `field.sub` lines under it.
    pub fields: Vec<LockedNode>,
}

/// The flat `path = Type` lines of an entry as a tree: each line under the nearest locked line its path
/// extends (a line without one stays at the top).
pub fn tree(fields: &[(String, String)]) -> Vec<LockedNode> {
    fn children(fields: &[(String, String)], parent: Option<&str>) -> Vec<LockedNode> {
        fields
            .iter()
            .filter(|(path, _)| locked_parent(fields, path) == parent)
            .map(|(path, ty)| LockedNode {
                name: parent.map_or(path.as_str(), |p| &path[p.len() + 1..]).to_owned(),
                ty: ty.clone(),
                fields: children(fields, Some(path)),
            })
            .collect()
    }
    children(fields, None)
}

/// The longest locked proper prefix of `path` (at a `.`).
fn locked_parent<'a>(fields: &'a [(String, String)], path: &str) -> Option<&'a str> {
    let mut rest = path;
    while let Some((parent, _)) = rest.rsplit_once('.') {
        if let Some((f, _)) = fields.iter().find(|(f, _)| f == parent) {
            return Some(f);
        }
        rest = parent;
    }
    None
}

/// The short, canonical form of a Rust type as written: every path reduced to its last segment
/// (`std::string::String` and `::std::string::String` are `String`, `std::collections::BTreeMap<K, V>` is
/// `BTreeMap<K,V>`), generic arguments likewise, and no whitespace except between two words
/// (`dyn Trait`, `&'static str`).
///
/// A type's module is where Rust code finds it, not what its JSON looks like, so moving or importing a type
/// differently is no schema change; what a type serializes to is locked by its own fields.
pub fn normalize_type(ty: &str) -> String {
    let chars: Vec<char> = ty.chars().collect();
    let mut out = String::with_capacity(ty.len());
    let mut i = 0;
    // Whether the last token written ends a word (an identifier, a lifetime or a number).
    let mut after_word = false;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            // A leading `::` starts an absolute path (`::std::...`); after `>` it reaches an associated item.
            if out.ends_with('>') {
                out.push_str("::");
                after_word = false;
            }
            i += 2;
        } else if c.is_alphanumeric() || c == '_' || c == '\'' {
            let start = i;
            i += 1;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '#') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // A word followed by `::` is a module (or type) on the way to the last segment: drop it.
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let is_path_prefix = chars.get(next) == Some(&':') && chars.get(next + 1) == Some(&':') && c != '\'';
            if is_path_prefix && !out.ends_with('>') {
                continue;
            }
            if after_word {
                out.push(' ');
            }
            out.push_str(&word);
            after_word = true;
        } else {
            out.push(c);
            i += 1;
            after_word = false;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(f, t)| ((*f).to_owned(), (*t).to_owned())).collect()
    }

    #[test]
    fn std_paths_are_their_short_form() {
        assert_eq!(normalize_type("std::string::String"), "String");
        assert_eq!(normalize_type(":: std :: string :: String"), "String");
        assert_eq!(normalize_type("::std::option::Option<T>"), "Option<T>");
        assert_eq!(normalize_type("alloc::vec::Vec<u8>"), "Vec<u8>");
        assert_eq!(normalize_type("core::option::Option<alloc::string::String>"), "Option<String>");
        assert_eq!(
            normalize_type("std::collections::BTreeMap<std::string::String, ::std::vec::Vec<i64>>"),
            "BTreeMap<String,Vec<i64>>"
        );
        assert_eq!(normalize_type("chrono::DateTime<chrono::Utc>"), "DateTime<Utc>");
    }

    #[test]
    fn whitespace_does_not_matter_but_words_stay_apart() {
        assert_eq!(normalize_type("Option < String >"), "Option<String>");
        assert_eq!(normalize_type("HashMap<String,\n    i64>"), "HashMap<String,i64>");
        assert_eq!(normalize_type("[u8 ; 32]"), "[u8;32]");
        assert_eq!(normalize_type("(String , u32)"), "(String,u32)");
        assert_eq!(normalize_type("Box<dyn std::error::Error>"), "Box<dyn Error>");
        assert_eq!(normalize_type("& 'static str"), "&'static str");
        assert_eq!(normalize_type("<T as Trait>::Assoc"), "<T as Trait>::Assoc");
        // What the derive wrote before normalisation still reads the same.
        assert_eq!(normalize_type("Option<String>"), "Option<String>");
        assert_eq!(normalize_type("i64"), "i64");
    }

    #[test]
    fn a_full_path_is_no_schema_change() {
        let locked = lines(&[("order_id", "String"), ("tags", "Vec<String>")]);
        let now = lines(&[("order_id", "std::string::String"), ("tags", "::std::vec::Vec<String>")]);
        assert_eq!(compare(&locked, &now), None);
        let changed = lines(&[("order_id", "std::string::String"), ("tags", "Vec<u8>")]);
        assert_eq!(
            compare(&locked, &changed),
            Some(SchemaChange::TypeChanged {
                field: "tags".into(),
                locked: "Vec<String>".into(),
                now: "Vec<u8>".into()
            })
        );
    }

    #[test]
    fn a_field_added_to_a_nested_type_is_a_change() {
        let locked = lines(&[("id", "String"), ("address", "Address"), ("address.street", "String")]);
        let now =
            lines(&[("id", "String"), ("address", "Address"), ("address.street", "String"), ("address.zip", "String")]);
        assert_eq!(compare(&locked, &now), Some(SchemaChange::Added { field: "address.zip".into() }));
        let renamed = lines(&[("id", "String"), ("address", "Address"), ("address.road", "String")]);
        assert_eq!(compare(&locked, &renamed), Some(SchemaChange::Added { field: "address.road".into() }));
        let gone = lines(&[("id", "String"), ("address", "Address")]);
        assert_eq!(compare(&locked, &gone), Some(SchemaChange::Removed { field: "address.street".into() }));
    }

    #[test]
    fn an_entry_locked_by_name_only_matches_and_gets_the_detail_when_blessed() {
        // Written before nested types were locked: `address = Address`, no `address.*` lines.
        let locked = lines(&[("id", "String"), ("address", "Address")]);
        let now = lines(&[("id", "String"), ("address", "Address"), ("address.street", "String")]);
        assert_eq!(compare(&locked, &now), None);
        assert_eq!(new_detail(&locked, &now), [&("address.street".to_owned(), "String".to_owned())]);
        // Its top-level type is still compared.
        let other = lines(&[("id", "String"), ("address", "Location"), ("address.street", "String")]);
        assert!(matches!(compare(&locked, &other), Some(SchemaChange::TypeChanged { .. })));
    }

    #[test]
    fn flat_lines_become_a_tree() {
        let flat = lines(&[("id", "String"), ("a", "A"), ("a.b", "B"), ("a.b.c", "u8"), ("a.d", "u8")]);
        let node = |name: &str, ty: &str, fields| LockedNode { name: name.into(), ty: ty.into(), fields };
        assert_eq!(
            tree(&flat),
            [
                node("id", "String", vec![]),
                node("a", "A", vec![node("b", "B", vec![node("c", "u8", vec![])]), node("d", "u8", vec![])]),
            ]
        );
    }

    #[test]
    fn old_lock_files_still_parse_and_match() {
        let text = "# events.lock\n\n[order.placed v2]\norder_id = String\ntotal_minor = i64\n";
        let lock = LockFile::parse(text).unwrap();
        let locked = &lock.entries[&("order.placed".to_owned(), 2)];
        assert_eq!(compare(locked, &lines(&[("order_id", "String"), ("total_minor", "i64")])), None);
        let round_trip = LockFile::parse(&lock.render()).unwrap();
        assert_eq!(round_trip, lock);
    }
}
