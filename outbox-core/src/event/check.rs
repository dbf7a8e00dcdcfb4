//! The compile-time half of the lock check: `#[derive(DomainEvent)]` embeds the locked entry it found in
//! `events.lock` and compares it, in a `const`, with what the types it cannot see declare (the fields of
//! nested types and of `upcast_from` structs, through [`PayloadSchema`](super::PayloadSchema)). A drift fails
//! the build with the message built here.
//!
//! The generated `const` panics itself (`if let Some(m) = lock_mismatch(..) { panic!("{}", m.as_str()) }`,
//! spanned at the user's field): a panic inside a function called from the `const` would add notes pointing
//! into this crate and `core` to the one error the user needs.

use super::schema::FieldSchema;

/// The `FIELDS` of a type whose `#[derive(PayloadSchema)]` or `#[derive(DomainEvent)]` failed: that derive
/// already reported the one error, so the lock comparison accepts it as it is instead of adding a second
/// error about fields it cannot know.
pub const UNCHECKED_FIELDS: &[FieldSchema] = &[FieldSchema { name: UNCHECKED, ty: UNCHECKED, fields: &[] }];

/// No JSON field or Rust type is spelled like this.
const UNCHECKED: &str = "\u{0}unchecked";

/// Whether `fields` is [`UNCHECKED_FIELDS`].
const fn is_unchecked(fields: &[FieldSchema]) -> bool {
    fields.len() == 1 && str_eq(fields[0].name, UNCHECKED) && str_eq(fields[0].ty, UNCHECKED)
}

/// The message of the first difference between `now` and `locked`, or `None` when they match.
///
/// The message is `head`, the first difference (with the field's path under `prefix`), then `advice`.
/// A locked field without nested lines is compared by its type only, like `outbox_schema_lock::compare`.
pub const fn lock_mismatch(
    head: &'static str,
    advice: &'static str,
    prefix: &'static str,
    locked: &'static [FieldSchema],
    now: &'static [FieldSchema],
) -> Option<LockMismatch> {
    let mut path = Path { segments: [""; MAX_DEPTH], len: 0 };
    if !prefix.is_empty() {
        path = path.with(prefix);
    }
    match first_drift(locked, now, path) {
        None => None,
        Some(drift) => {
            let mut message = LockMismatch { bytes: [0; MESSAGE_CAPACITY], len: 0 };
            message.push(head);
            message.push(": ");
            drift.describe(&mut message);
            message.push(". ");
            message.push(advice);
            Some(message)
        }
    }
}

const MAX_DEPTH: usize = 16;
const MESSAGE_CAPACITY: usize = 1024;

#[derive(Clone, Copy)]
struct Path {
    segments: [&'static str; MAX_DEPTH],
    len: usize,
}

impl Path {
    const fn with(mut self, segment: &'static str) -> Path {
        if self.len < MAX_DEPTH {
            self.segments[self.len] = segment;
            self.len += 1;
        }
        self
    }
}

enum Change {
    Added,
    Removed,
    TypeChanged { locked: &'static str, now: &'static str },
}

struct Drift {
    path: Path,
    change: Change,
}

impl Drift {
    const fn describe(&self, message: &mut LockMismatch) {
        message.push("field `");
        let mut i = 0;
        while i < self.path.len {
            if i > 0 {
                message.push(".");
            }
            message.push(self.path.segments[i]);
            i += 1;
        }
        match self.change {
            Change::Added => message.push("` is not in events.lock"),
            Change::Removed => message.push("` is in events.lock but no longer in the struct"),
            Change::TypeChanged { locked, now } => {
                message.push("` is `");
                message.push(now);
                message.push("` but events.lock has `");
                message.push(locked);
                message.push("`");
            }
        }
    }
}

const fn find(fields: &'static [FieldSchema], name: &str) -> Option<&'static FieldSchema> {
    let mut i = 0;
    while i < fields.len() {
        if str_eq(fields[i].name, name) {
            return Some(&fields[i]);
        }
        i += 1;
    }
    None
}

const fn first_drift(locked: &'static [FieldSchema], now: &'static [FieldSchema], path: Path) -> Option<Drift> {
    if is_unchecked(now) {
        return None;
    }
    let mut i = 0;
    while i < now.len() {
        let field = &now[i];
        match find(locked, field.name) {
            None => return Some(Drift { path: path.with(field.name), change: Change::Added }),
            Some(entry) => {
                if !str_eq(entry.ty, field.ty) {
                    let change = Change::TypeChanged { locked: entry.ty, now: field.ty };
                    return Some(Drift { path: path.with(field.name), change });
                }
                // No nested lines in the lock: the field is locked by its type (an older entry, or by name).
                if !entry.fields.is_empty()
                    && path.len < MAX_DEPTH
                    && let Some(drift) = first_drift(entry.fields, field.fields, path.with(field.name))
                {
                    return Some(drift);
                }
            }
        }
        i += 1;
    }
    let mut i = 0;
    while i < locked.len() {
        if find(now, locked[i].name).is_none() {
            return Some(Drift { path: path.with(locked[i].name), change: Change::Removed });
        }
        i += 1;
    }
    None
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The text of a lock mismatch, in a fixed buffer: a `const` cannot allocate. A part that does not fit is
/// left out whole, so the text stays valid UTF-8.
pub struct LockMismatch {
    bytes: [u8; MESSAGE_CAPACITY],
    len: usize,
}

impl LockMismatch {
    const fn push(&mut self, part: &str) {
        let part = part.as_bytes();
        if self.len + part.len() > MESSAGE_CAPACITY {
            return;
        }
        let mut i = 0;
        while i < part.len() {
            self.bytes[self.len + i] = part[i];
            i += 1;
        }
        self.len += part.len();
    }

    /// The message.
    pub const fn as_str(&self) -> &str {
        match std::str::from_utf8(self.bytes.split_at(self.len).0) {
            Ok(text) => text,
            Err(_) => "the schema differs from events.lock",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn field(name: &'static str, ty: &'static str, fields: &'static [FieldSchema]) -> FieldSchema {
        FieldSchema { name, ty, fields }
    }

    const LOCKED: &[FieldSchema] =
        &[field("id", "String", &[]), field("address", "Address", &[field("street", "String", &[])])];

    fn drift(now: &'static [FieldSchema]) -> Option<String> {
        first_drift(LOCKED, now, Path { segments: [""; MAX_DEPTH], len: 0 }).map(|d| {
            let mut message = LockMismatch { bytes: [0; MESSAGE_CAPACITY], len: 0 };
            d.describe(&mut message);
            message.as_str().to_owned()
        })
    }

    #[test]
    fn nested_fields_are_compared_by_path() {
        assert_eq!(drift(LOCKED), None);
        static ADDED: &[FieldSchema] = &[
            field("id", "String", &[]),
            field("address", "Address", &[field("street", "String", &[]), field("zip", "String", &[])]),
        ];
        assert_eq!(drift(ADDED).as_deref(), Some("field `address.zip` is not in events.lock"));
        static RETYPED: &[FieldSchema] =
            &[field("id", "String", &[]), field("address", "Address", &[field("street", "u8", &[])])];
        assert_eq!(drift(RETYPED).as_deref(), Some("field `address.street` is `u8` but events.lock has `String`"));
        static GONE: &[FieldSchema] = &[field("address", "Address", &[field("street", "String", &[])])];
        assert_eq!(drift(GONE).as_deref(), Some("field `id` is in events.lock but no longer in the struct"));
    }

    #[test]
    fn a_field_locked_by_type_only_ignores_its_detail() {
        static LEGACY: &[FieldSchema] = &[field("address", "Address", &[])];
        static NOW: &[FieldSchema] = &[field("address", "Address", &[field("street", "String", &[])])];
        assert!(first_drift(LEGACY, NOW, Path { segments: [""; MAX_DEPTH], len: 0 }).is_none());
    }

    #[test]
    fn fields_of_a_failed_derive_match_any_entry() {
        static NOW: &[FieldSchema] = &[field("id", "String", &[]), field("address", "Address", UNCHECKED_FIELDS)];
        assert!(first_drift(LOCKED, NOW, Path { segments: [""; MAX_DEPTH], len: 0 }).is_none());
        assert!(lock_mismatch("h", "a", "", LOCKED, UNCHECKED_FIELDS).is_none());
    }

    #[test]
    fn the_message_is_head_drift_and_advice() {
        static ADDED: &[FieldSchema] = &[field("street", "String", &[]), field("zip", "String", &[])];
        let mismatch =
            lock_mismatch("event `e v1` does not match", "Bump the version", "address", LOCKED[1].fields, ADDED);
        assert_eq!(
            mismatch.as_ref().map(LockMismatch::as_str),
            Some("event `e v1` does not match: field `address.zip` is not in events.lock. Bump the version")
        );
    }

    #[test]
    fn a_message_too_long_is_cut_at_a_whole_part() {
        let mut message = LockMismatch { bytes: [0; MESSAGE_CAPACITY], len: 0 };
        message.push("é");
        message.push(&"x".repeat(MESSAGE_CAPACITY));
        assert_eq!(message.as_str(), "é");
    }
}
