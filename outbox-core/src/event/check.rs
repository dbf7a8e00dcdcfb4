//! The compile-time half of the lock check: `#[derive(DomainEvent)]` embeds the locked entry it found in
//! `events.lock` and compares it, in a `const`, with what the types it cannot see declare (the fields of
//! nested types and of `upcast_from` structs, through [`PayloadSchema`](super::PayloadSchema)). A drift fails
//! the build with the message built here.

use super::schema::FieldSchema;

/// Fails compilation (it is called in a `const`) when `now` differs from `locked`.
///
/// The message is `head`, the first difference (with the field's path under `prefix`), then `advice`.
/// A locked field without nested lines is compared by its type only, like `outbox_schema_lock::compare`.
pub const fn assert_locked(
    head: &'static str,
    advice: &'static str,
    prefix: &'static str,
    locked: &'static [FieldSchema],
    now: &'static [FieldSchema],
) {
    let mut path = Path { segments: [""; MAX_DEPTH], len: 0 };
    if !prefix.is_empty() {
        path = path.with(prefix);
    }
    if let Some(drift) = first_drift(locked, now, path) {
        let mut message = Message { bytes: [0; MESSAGE_CAPACITY], len: 0 };
        message.push(head);
        message.push(": ");
        drift.describe(&mut message);
        message.push(". ");
        message.push(advice);
        panic!("{}", message.as_str());
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
    const fn describe(&self, message: &mut Message) {
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

/// A fixed buffer: a `const` cannot allocate. A part that does not fit is left out whole, so the text
/// stays valid UTF-8.
struct Message {
    bytes: [u8; MESSAGE_CAPACITY],
    len: usize,
}

impl Message {
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

    const fn as_str(&self) -> &str {
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
            let mut message = Message { bytes: [0; MESSAGE_CAPACITY], len: 0 };
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
    fn a_message_too_long_is_cut_at_a_whole_part() {
        let mut message = Message { bytes: [0; MESSAGE_CAPACITY], len: 0 };
        message.push("é");
        message.push(&"x".repeat(MESSAGE_CAPACITY));
        assert_eq!(message.as_str(), "é");
    }
}
