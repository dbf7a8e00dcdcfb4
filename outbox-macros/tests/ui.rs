//! Compile-time behaviour of the macros: what compiles, and the message for each misuse.
//! Regenerate the `.stderr` snapshots with `TRYBUILD=overwrite cargo test -p outbox-macros --test ui`.
//!
//! One `TestCases` for all three macros, so trybuild builds its project (and outbox-seaorm, without any
//! driver) once.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    for macro_name in ["domain_event", "transactional_outbox", "idempotent_handler"] {
        t.pass(format!("tests/ui/{macro_name}/pass/*.rs"));
        t.compile_fail(format!("tests/ui/{macro_name}/fail/*.rs"));
    }
}
