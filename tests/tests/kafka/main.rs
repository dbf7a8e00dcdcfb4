//! The Kafka tests, in a test binary of their own: the client is librdkafka, C code with threads of its
//! own, and a crash in it (a SIGSEGV once, while two Kafka cases ran beside a CPU-heavy build) takes its
//! whole process down: here it costs the Kafka results only, not the other subjects' (`suite/`).

#[path = "../suite/common/mod.rs"]
mod common;
#[path = "helpers.rs"]
mod kafka;

mod broker_kafka;
mod broker_kafka_mock;
mod contract_kafka;
