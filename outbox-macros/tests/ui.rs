//! Compile-time behaviour of the macros: what compiles, and the message for each misuse.
//! Regenerate the `.stderr` snapshots with `TRYBUILD=overwrite cargo test -p outbox-macros --test ui`.

#[test]
fn domain_event() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/domain_event/pass/*.rs");
    t.compile_fail("tests/ui/domain_event/fail/*.rs");
}

#[test]
fn transactional_outbox() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/transactional_outbox/pass/*.rs");
    t.compile_fail("tests/ui/transactional_outbox/fail/*.rs");
}

#[test]
fn idempotent_handler() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/idempotent_handler/pass/*.rs");
    t.compile_fail("tests/ui/idempotent_handler/fail/*.rs");
}
