//! The lock test on temporary lock files: what each drift says, and bless mode.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::lock::verify;
use crate::{DomainEvent, PayloadSchema};

/// A fresh lock-file path of its own for each test (the file itself is not created).
fn temp_lock(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outbox-lock-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("events.lock")
}

fn lock_with(test: &str, text: &str) -> PathBuf {
    let path = temp_lock(test);
    std::fs::write(&path, text).unwrap();
    path
}

/// v1 as it was released: `total` in major units. Its fields are renamed here (`total_major`), as a
/// refactoring might do.
#[derive(PayloadSchema, Serialize, Deserialize)]
struct PlacedV1 {
    order_id: String,
    total_major: i64,
}

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "test.placed", version = 2, aggregate = "order", upcast_from(v1 = PlacedV1))]
struct Placed {
    #[aggregate_id]
    order_id: String,
    total_minor: i64,
}

impl From<PlacedV1> for Placed {
    fn from(v1: PlacedV1) -> Self {
        Placed { order_id: v1.order_id, total_minor: v1.total_major * 100 }
    }
}

const PLACED_LOCK: &str = "[test.placed v1]\norder_id = String\ntotal = i64\n\n\
                           [test.placed v2]\norder_id = String\ntotal_minor = i64\n";

#[test]
fn a_renamed_field_in_an_upcast_from_struct_fails_the_lock_test() {
    let path = lock_with("upcast", PLACED_LOCK);
    let error = verify(&path, &[Placed::SCHEMA], false).unwrap_err();
    assert!(
        error.contains("`test.placed v1` (`PlacedV1`, the `upcast_from` struct of `Placed`) differs from its entry"),
        "{error}"
    );
    assert!(error.contains("field `total_major` is not in events.lock"), "{error}");
    assert!(error.contains("every stored v1 event, which would then fail to decode: restore its locked fields"));
    // Bless mode does not rewrite a locked entry either.
    assert!(verify(&path, &[Placed::SCHEMA], true).is_err());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), PLACED_LOCK);
}

#[derive(PayloadSchema, Serialize, Deserialize)]
struct Address {
    street: String,
    zip: String,
}

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "test.shipped", version = 1, aggregate = "order")]
struct Shipped {
    #[aggregate_id]
    order_id: String,
    to: Option<Address>,
}

#[test]
fn a_field_added_to_a_nested_type_fails_the_lock_test() {
    let lines = Shipped::SCHEMA.lock_lines();
    let expected = [("order_id", "String"), ("to", "Option<Address>"), ("to.street", "String"), ("to.zip", "String")];
    assert_eq!(lines, expected.map(|(f, t)| (f.to_owned(), t.to_owned())));

    let path = lock_with("nested", "[test.shipped v1]\norder_id = String\nto = Option<Address>\nto.street = String\n");
    let error = verify(&path, &[Shipped::SCHEMA], false).unwrap_err();
    assert!(error.contains("`test.shipped v1` (`Shipped`) differs from its entry"), "{error}");
    assert!(error.contains("field `to.zip` is not in events.lock"), "{error}");
    assert!(error.contains("bump the version to 2 and add `upcast_from(v1 = ...)`"), "{error}");
}

#[test]
fn an_entry_that_locked_a_nested_type_by_name_gets_its_fields_when_blessed() {
    let old = "[test.shipped v1]\norder_id = String\nto = Option<Address>\n";
    let path = lock_with("legacy", old);
    let error = verify(&path, &[Shipped::SCHEMA], false).unwrap_err();
    assert!(error.contains("does not lock yet (to.street, to.zip; the entry predates nested locking)"), "{error}");
    assert!(error.contains("run `OUTBOX_BLESS=1 cargo test` to add them"), "{error}");
    verify(&path, &[Shipped::SCHEMA], true).unwrap();
    let blessed = std::fs::read_to_string(&path).unwrap();
    assert!(blessed.contains("to = Option<Address>\nto.street = String\nto.zip = String\n"), "{blessed}");
    verify(&path, &[Shipped::SCHEMA], false).unwrap();
}

#[test]
fn a_new_event_is_reported_until_blessed_and_bless_creates_the_file() {
    let path = temp_lock("bless");
    let error = verify(&path, &[Placed::SCHEMA, Shipped::SCHEMA], false).unwrap_err();
    assert!(error.starts_with(&format!("no events.lock at {}: run `OUTBOX_BLESS=1 cargo test`", path.display())));
    assert!(!path.exists());

    verify(&path, &[Placed::SCHEMA], true).unwrap();
    let blessed = std::fs::read_to_string(&path).unwrap();
    assert!(blessed.starts_with("# events.lock"), "{blessed}");
    assert!(blessed.contains("[test.placed v1]\norder_id = String\ntotal_major = i64\n"), "{blessed}");
    assert!(blessed.contains("[test.placed v2]\norder_id = String\ntotal_minor = i64\n"), "{blessed}");

    let error = verify(&path, &[Placed::SCHEMA, Shipped::SCHEMA], false).unwrap_err();
    assert_eq!(
        error,
        format!(
            "`test.shipped v1` (`Shipped`) is not in {}; run `OUTBOX_BLESS=1 cargo test` to lock it",
            path.display()
        )
    );
    verify(&path, &[Placed::SCHEMA, Shipped::SCHEMA], true).unwrap();
    verify(&path, &[Placed::SCHEMA, Shipped::SCHEMA], false).unwrap();
}

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "test.paths", version = 1, aggregate = "order")]
struct FullPaths {
    #[aggregate_id]
    order_id: std::string::String,
    tags: ::std::option::Option<std::vec::Vec<std::string::String>>,
    totals: std::collections::BTreeMap<String, i64>,
}

#[test]
fn a_full_std_path_is_no_drift() {
    let types: Vec<_> = FullPaths::SCHEMA.fields.iter().map(|f| f.ty).collect();
    assert_eq!(types, ["String", "Option<Vec<String>>", "BTreeMap<String,i64>"]);
    // Short forms, or the same paths with other spacing, as a person or an older version wrote them.
    let path = lock_with(
        "paths",
        "[test.paths v1]\norder_id = String\ntags = Option<std::vec::Vec<String>>\ntotals = BTreeMap<String, i64>\n",
    );
    verify(&path, &[FullPaths::SCHEMA], false).unwrap();
}

/// Two types claiming one version with different fields.
#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "test.placed", version = 2, aggregate = "order")]
struct PlacedElsewhere {
    #[aggregate_id]
    order_id: String,
}

#[test]
fn two_types_describing_one_version_differently_are_reported() {
    let path = lock_with("twice", PLACED_LOCK);
    let error = verify(&path, &[Placed::SCHEMA, PlacedElsewhere::SCHEMA], false).unwrap_err();
    assert!(
        error
            .contains("`test.placed v2` (`Placed`) and `test.placed v2` (`PlacedElsewhere`) describe the same version"),
        "{error}"
    );
}

#[test]
fn derived_events_are_registered_with_their_lock_file() {
    let default_lock = concat!(env!("CARGO_MANIFEST_DIR"), "/events.lock");
    let (schemas, _) = super::lock::registered(std::path::Path::new(default_lock));
    let names: Vec<_> = schemas.iter().map(|s| (s.name, s.version, s.type_name)).collect();
    for expected in [("test.placed", 2, "Placed"), ("test.shipped", 1, "Shipped"), ("test.paths", 1, "FullPaths")] {
        assert!(names.contains(&expected), "{expected:?} not in {names:?}");
    }
    let missing = temp_lock("registry");
    let error = super::verify_events_lock_all(&missing).unwrap_err();
    assert!(error.contains("does not exist, and no `#[derive(DomainEvent)]` type linked into this binary"), "{error}");
    assert!(error.contains(&format!("(they use {default_lock})")), "{error}");
    assert!(error.ends_with("run `OUTBOX_BLESS=1 cargo test` there to create the file"), "{error}");
    std::fs::write(&missing, "").unwrap();
    let error = super::verify_events_lock_all(&missing).unwrap_err();
    assert!(error.starts_with("no `#[derive(DomainEvent)]` type linked into this binary is locked in"), "{error}");
    assert!(!error.contains("OUTBOX_BLESS"), "{error}");
}

#[derive(PayloadSchema, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", rename_all_fields = "camelCase")]
#[allow(dead_code)]
enum Payment {
    Cash,
    #[serde(rename = "card_payment")]
    Card(Address),
    Split(u32, u32),
    Voucher {
        voucher_code: String,
    },
    #[serde(skip)]
    Internal,
}

#[derive(PayloadSchema, Serialize, Deserialize)]
struct OrderId(String);

#[derive(PayloadSchema, Serialize, Deserialize)]
struct Paid {
    id: OrderId,
    by: Payment,
    #[serde(with = "by_name")]
    amount: Money,
    #[payload_schema(by_name)]
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<Money>,
}

/// A type without `PayloadSchema`, as from another crate.
#[derive(Serialize, Deserialize, Default)]
struct Money(i64);

mod by_name {
    pub fn serialize<S: serde::Serializer>(money: &super::Money, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(money.0)
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<super::Money, D::Error> {
        <i64 as serde::Deserialize>::deserialize(d).map(super::Money)
    }
}

#[test]
fn enums_newtypes_and_fields_locked_by_name_have_their_lines() {
    let schema =
        super::EventSchema { name: "test.paid", version: 1, type_name: "Paid", fields: Paid::FIELDS, upcast_from: &[] };
    let lines: Vec<String> = schema.lock_lines().into_iter().map(|(f, t)| format!("{f} = {t}")).collect();
    assert_eq!(
        lines,
        [
            "id = OrderId",
            "id.0 = String",
            "by = Payment",
            "by.cash = variant",
            "by.card_payment = variant(Address)",
            "by.card_payment.street = String",
            "by.card_payment.zip = String",
            "by.split = variant(u32,u32)",
            "by.split.0 = u32",
            "by.split.1 = u32",
            "by.voucher = variant{}",
            "by.voucher.voucherCode = String",
            "amount = Money",
            "note = Option<Money>",
        ]
    );
}

/// A type that holds itself: its fields are locked once, the inner one by name.
#[derive(PayloadSchema, Serialize, Deserialize)]
struct Node {
    name: String,
    children: Vec<Node>,
}

#[test]
fn a_recursive_type_is_locked_one_level_deep() {
    let lines: Vec<_> = Node::FIELDS.iter().map(|f| (f.name, f.ty, f.fields.len())).collect();
    assert_eq!(lines, [("name", "String", 0), ("children", "Vec<Node>", 0)]);
}
