//! What `events.lock` records of a type: [`FieldSchema`] trees, [`PayloadSchema`] and its implementations for
//! the standard types.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, LinkedList, VecDeque};

/// One field of an event's schema, with the fields of its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldSchema {
    /// The JSON field name (serde renames applied); for an enum, the variant's name.
    pub name: &'static str,
    /// The Rust type in its short form (`Option<String>`, see `outbox_schema_lock::normalize_type`); for an
    /// enum variant, `variant`, `variant(Type)` or `variant{}`.
    pub ty: &'static str,
    /// The fields of the struct (or the variants of the enum) inside `ty`, looked through `Option`, `Vec`,
    /// `Box`, maps and the like: [`PayloadSchema::FIELDS`] of the type. Empty for a number, a string, or a
    /// type locked by name only.
    pub fields: &'static [FieldSchema],
}

/// The schema of one event version, computed at compile time by the derive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventSchema {
    /// The stable event name.
    pub name: &'static str,
    /// The schema version.
    pub version: i32,
    /// The Rust type whose fields these are (the event, or the `upcast_from` struct of an older version).
    pub type_name: &'static str,
    /// The fields, in declaration order.
    pub fields: &'static [FieldSchema],
    /// The older versions the event decodes (`upcast_from`), oldest first: each the fields of the struct that
    /// reads its stored payloads, checked against that version's own entry.
    pub upcast_from: &'static [EventSchema],
}

impl EventSchema {
    /// The fields as lock-file lines: `(path, type)`, a nested field right after its parent as
    /// `parent.field`.
    pub fn lock_lines(&self) -> Vec<(String, String)> {
        let mut lines = Vec::new();
        flatten(self.fields, "", 0, &mut lines);
        lines
    }
}

/// Deeper nesting than this is not recorded (a guard, not a limit any payload reaches).
const MAX_DEPTH: usize = 16;

fn flatten(fields: &[FieldSchema], prefix: &str, depth: usize, lines: &mut Vec<(String, String)>) {
    for field in fields {
        let path = if prefix.is_empty() { field.name.to_owned() } else { format!("{prefix}.{}", field.name) };
        lines.push((path.clone(), field.ty.to_owned()));
        if depth < MAX_DEPTH {
            flatten(field.fields, &path, depth + 1, lines);
        }
    }
}

/// The shape of a type inside an event's payload, as `events.lock` records it: the fields of a struct (the
/// variants of an enum), each with its own.
///
/// `#[derive(PayloadSchema)]` implements it for a struct or an enum next to its `Serialize`, reading the same
/// serde renames; `#[derive(DomainEvent)]` implements it for the event itself. Every type a locked field
/// holds must implement it (the standard library's types, `uuid::Uuid`, `chrono`'s and `serde_json::Value`
/// do), so a field added to a nested type, or to an `upcast_from` struct, changes the schema. A type from
/// another crate can be locked by name only with `#[payload_schema(by_name)]` on the field.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no schema for events.lock",
    label = "`{Self}` does not implement `PayloadSchema`",
    note = "add `#[derive(PayloadSchema)]` to `{Self}` (next to its `Serialize`) so events.lock locks its fields too",
    note = "for a type from another crate, mark the field `#[payload_schema(by_name)]`: it is then locked by its type name only"
)]
pub trait PayloadSchema {
    /// The fields this type serializes to (empty for a number, a string or any value without fields).
    const FIELDS: &'static [FieldSchema];
}

/// Values without fields of their own.
macro_rules! leaves {
    ($($ty:ty),* $(,)?) => {
        $(impl PayloadSchema for $ty {
            const FIELDS: &'static [FieldSchema] = &[];
        })*
    };
}

leaves!(
    bool,
    char,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    f32,
    f64,
    (),
    str,
    String,
    std::time::Duration,
    std::time::SystemTime,
    std::path::PathBuf,
    std::net::IpAddr,
    std::net::Ipv4Addr,
    std::net::Ipv6Addr,
    std::net::SocketAddr,
    std::num::NonZeroU8,
    std::num::NonZeroU16,
    std::num::NonZeroU32,
    std::num::NonZeroU64,
    std::num::NonZeroI32,
    std::num::NonZeroI64,
    serde_json::Value,
    serde_json::Map<String, serde_json::Value>,
    serde_json::Number,
    serde_json::value::RawValue,
    uuid::Uuid,
    chrono::NaiveDate,
    chrono::NaiveDateTime,
    chrono::NaiveTime,
);

impl<Tz: chrono::TimeZone> PayloadSchema for chrono::DateTime<Tz> {
    const FIELDS: &'static [FieldSchema] = &[];
}

/// Containers: their JSON holds the element's, so the element's fields are theirs.
macro_rules! containers {
    ($(impl<$($param:ident),*> for $ty:ty => $elem:ident;)*) => {
        $(impl<$($param),*> PayloadSchema for $ty where $elem: PayloadSchema {
            const FIELDS: &'static [FieldSchema] = <$elem as PayloadSchema>::FIELDS;
        })*
    };
}

containers! {
    impl<T> for Option<T> => T;
    impl<T> for Vec<T> => T;
    impl<T> for VecDeque<T> => T;
    impl<T> for LinkedList<T> => T;
    impl<T> for BTreeSet<T> => T;
    impl<T, S> for HashSet<T, S> => T;
    impl<K, V> for BTreeMap<K, V> => V;
    impl<K, V, S> for HashMap<K, V, S> => V;
}

impl<T: PayloadSchema + ?Sized> PayloadSchema for Box<T> {
    const FIELDS: &'static [FieldSchema] = T::FIELDS;
}

impl<T: PayloadSchema + ?Sized> PayloadSchema for std::sync::Arc<T> {
    const FIELDS: &'static [FieldSchema] = T::FIELDS;
}

impl<T: PayloadSchema + ?Sized> PayloadSchema for std::rc::Rc<T> {
    const FIELDS: &'static [FieldSchema] = T::FIELDS;
}

impl<T: PayloadSchema + ToOwned + ?Sized> PayloadSchema for std::borrow::Cow<'_, T> {
    const FIELDS: &'static [FieldSchema] = T::FIELDS;
}

impl<T: PayloadSchema> PayloadSchema for [T] {
    const FIELDS: &'static [FieldSchema] = T::FIELDS;
}

impl<T: PayloadSchema, const N: usize> PayloadSchema for [T; N] {
    const FIELDS: &'static [FieldSchema] = T::FIELDS;
}
