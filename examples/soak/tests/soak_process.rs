//! The soak tool as a process: a run of no time commits nothing and its history holds. (This test also
//! makes `cargo test` build the soak's binary with the workspace's features, which CI then runs.)

use std::process::Command;

#[test]
fn a_run_of_no_time_holds_with_nothing_committed() {
    let run = Command::new(env!("CARGO_BIN_EXE_outbox-soak")).args(["--duration", "0s"]).output().expect("runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("\"committed\":0") && stdout.contains("\"lost\":0"), "{stdout}");
}
