//! What the CLI's test binaries share: the binary without inherited settings, a child process stopped
//! like a service, and plain HTTP requests.

#![allow(dead_code)]

use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use outbox_integration_tests::TestDb;

/// `outbox` with no inherited `DATABASE_URL` or `OUTBOX_*` settings.
pub fn outbox() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox"));
    command.env_remove("DATABASE_URL");
    for (name, _) in std::env::vars() {
        if name.starts_with("OUTBOX_") {
            command.env_remove(name);
        }
    }
    command.env("OUTBOX_LOG", "warn").env("OUTBOX_CONNECT_TIMEOUT", "2s");
    command
}

/// The URL and the extra arguments that point the CLI at `t`'s database (PostgreSQL: its schema).
pub fn target(t: &TestDb) -> (String, Vec<String>) {
    match t.url.split_once('#') {
        Some((base, schema)) => (base.to_owned(), vec!["--schema".to_owned(), schema.to_owned()]),
        None => (t.url.clone(), Vec::new()),
    }
}

pub fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// A child `outbox` process, killed when dropped.
pub struct Running(pub Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Running {
    /// Sends SIGTERM and collects the output once the process exits (within 10 s).
    pub fn terminate(mut self) -> Output {
        let mut child = self.0.take().expect("running");
        let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
        assert!(status.success(), "kill -TERM failed");
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait().expect("wait").is_none() {
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!("the relay did not stop within 10 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().expect("output")
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// `GET path` over plain HTTP/1.1; the status code and the body. Retries the connection for 10 s while the
/// relay starts.
pub fn get(port: u16, path: &str) -> (u16, String) {
    request(port, "GET", path)
}

/// `method path` without a body, as [`get`].
pub fn request(port: u16, method: &str, path: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => break stream,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(error) => panic!("nothing answers on port {port}: {error}"),
        }
    };
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{response}"));
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    (status, body)
}
