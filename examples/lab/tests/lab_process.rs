//! The lab as a process: a broker URL it cannot use fails its scenario and the run, with the schemes it
//! takes. (This test also makes `cargo test` build the lab's binary with the workspace's features, which
//! CI then runs on each database and broker.)

use std::process::Command;

#[test]
fn a_broker_url_of_an_unknown_scheme_fails_the_run_and_names_the_schemes() {
    let dir = std::env::temp_dir().join(format!("outbox-lab-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let url = format!("sqlite://{}?mode=rwc", dir.join("lab.db").display());
    let run = Command::new(env!("CARGO_BIN_EXE_outbox-lab"))
        .args(["--broker", "ftp://broker.example"])
        .env("DATABASE_URL", &url)
        .output()
        .expect("the lab runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(!run.status.success(), "the lab must fail: {stdout}");
    assert!(stdout.contains("expected one of nats, kafka, amqp"), "{stdout}");
    assert!(stdout.contains("lab: 5 of 6 scenarios hold"), "only the broker's scenario fails: {stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}
