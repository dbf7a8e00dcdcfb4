//! The integration tests against the real servers, in one test binary: one build and one link of the
//! workspace for all of them, and their waits on the servers overlap. Each module is one subject; every
//! test has its own schema, database or file (`outbox_integration_tests::run_on`), so modules never share
//! rows. The Kafka tests are `tests/tests/kafka/` (librdkafka is C: a crash there ends only its own process).
//! Three more subjects have binaries of their own: `secrets.rs` captures every log line of its process at
//! trace level, `observability.rs` exports the library's spans through a subscriber of its test's thread
//! (tracing caches per call site, for the whole process, whether any subscriber wants it: tests of other
//! subjects hitting the relay's call sites from other threads at once made its spans go missing), and
//! `macros.rs` checks `events.lock` against every event type linked into its binary.

mod common;

mod bad_input;
mod bad_rows;
mod broker_connect;
mod broker_nats;
mod broker_rabbitmq;
mod broker_redis;
mod cdc;
mod claim_plans;
mod composition;
mod concurrency;
mod connection_faults;
mod contract_nats;
mod contract_rabbitmq;
mod contract_redis;
mod crash;
mod dashboard;
mod debezium_shape;
mod docs_sql;
mod enqueue;
mod foreign_writers;
mod group_commit;
mod handler_timeout;
mod hung_broker;
mod inbox;
mod lab_scenarios;
mod lease;
mod lock_plans;
mod log_relay;
mod maintenance;
mod migrations;
mod nats_cluster;
mod no_fault_duplicates;
mod notify;
mod ops;
mod ordering;
mod partitioned;
mod process_faults;
mod relay;
mod runs;
mod service;
mod services_compose;
mod smoke;
mod testkit;
mod wake;
