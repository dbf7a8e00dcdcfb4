//! The SQL shape DEBEZIUM.md's Outbox Event Router configuration relies on, on PostgreSQL: the columns it
//! names exist with the types it expects, the table has a primary key and a usable replica identity, and the
//! write path only ever INSERTs one row per event into `outbox_events` (an `UPDATE` there would reach the
//! router as an invalid operation). With `wal_level=logical`, a logical decoding smoke reads the inserts
//! back from the WAL.

use crate::common;

use outbox_integration_tests::{Backend, TestDb, run_on};
use sea_orm::{ConnectionTrait, DbBackend, QueryResult, Statement, TransactionTrait};

async fn query(t: &TestDb, conn: &impl ConnectionTrait, sql: &str) -> Vec<QueryResult> {
    conn.query_all_raw(Statement::from_string(DbBackend::Postgres, sql.to_owned()))
        .await
        .unwrap_or_else(|e| panic!("{t}: {sql}: {e}"))
}

fn text(t: &TestDb, row: &QueryResult, column: &str) -> String {
    row.try_get::<String>("", column).unwrap_or_else(|e| panic!("{t}: {column}: {e}"))
}

fn int(t: &TestDb, row: &QueryResult, column: &str) -> i64 {
    row.try_get::<i64>("", column).unwrap_or_else(|e| panic!("{t}: {column}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_table_has_the_shape_the_debezium_outbox_event_router_config_names() {
    run_on(Backend::Postgres, "debezium_shape", async |t: TestDb| {
        // The columns the SMT options name, with the types DEBEZIUM.md's table gives.
        let rows = query(
            &t,
            &t.db,
            "SELECT column_name::text AS name, data_type::text AS type, is_nullable::text AS nullable \
             FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = 'outbox_events'",
        )
        .await;
        let columns: std::collections::BTreeMap<String, (String, String)> =
            rows.iter().map(|r| (text(&t, r, "name"), (text(&t, r, "type"), text(&t, r, "nullable")))).collect();
        for (column, expected) in [
            ("seq", "bigint"),
            ("event_id", "character varying"),       // table.field.event.id
            ("aggregate_id", "character varying"),   // table.field.event.key
            ("aggregate_type", "character varying"), // route.by.field
            ("payload", "jsonb"),                    // table.field.event.payload (+ table.expand.json.payload)
            ("event_type", "character varying"),     // additional placement: ce_type
            ("schema_version", "integer"),           // additional placement: outbox_schema_version
            ("aggregate_version", "bigint"),         // additional placement: outbox_aggregate_version
            ("created_at_ms", "bigint"),             // additional placement: outbox_created_at_ms
            ("headers", "jsonb"),                    // additional placement: outbox_headers
        ] {
            let (found, nullable) =
                columns.get(column).unwrap_or_else(|| panic!("{t}: outbox_events has no column {column}: {columns:?}"));
            assert_eq!(found, expected, "{t}: outbox_events.{column}");
            assert_eq!(nullable, "NO", "{t}: outbox_events.{column} is NOT NULL: the router reads it for every row");
        }

        // A primary key, and the default replica identity (which uses it) is in force and can be set.
        let pk = query(
            &t,
            &t.db,
            "SELECT string_agg(k.column_name::text, ',') AS columns FROM information_schema.table_constraints c \
             JOIN information_schema.key_column_usage k USING (constraint_schema, constraint_name) \
             WHERE c.table_schema = current_schema() AND c.table_name = 'outbox_events' \
             AND c.constraint_type = 'PRIMARY KEY'",
        )
        .await;
        assert_eq!(pk.first().map(|r| text(&t, r, "columns")).as_deref(), Some("seq"), "{t}: primary key");
        t.db.execute_unprepared("ALTER TABLE outbox_events REPLICA IDENTITY DEFAULT")
            .await
            .unwrap_or_else(|e| panic!("{t}: REPLICA IDENTITY DEFAULT: {e}"));
        let identity = query(
            &t,
            &t.db,
            "SELECT relreplident::text AS identity FROM pg_class WHERE oid = 'outbox_events'::regclass",
        )
        .await;
        assert_eq!(identity.first().map(|r| text(&t, r, "identity")).as_deref(), Some("d"), "{t}: replica identity");

        // The write path: three events of two aggregates in one transaction are three INSERTed rows of
        // `outbox_events`, and nothing updates or deletes a row of it (the version counters live in
        // `outbox_aggregates`, which the connector does not capture).
        let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
        let events = [
            common::event("o1", "order.placed", 1),
            common::event("o1", "order.paid", 2),
            common::event("o2", "order.placed", 3),
        ];
        outbox_seaorm::enqueue_all(&txn, &events).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        outbox_seaorm::enqueue(&txn, &common::event("o2", "order.paid", 4))
            .await
            .unwrap_or_else(|e| panic!("{t}: {e}"));
        let counts = query(
            &t,
            &txn,
            "SELECT relname::text AS name, n_tup_ins AS ins, n_tup_upd AS upd, n_tup_del AS del \
             FROM pg_stat_xact_user_tables WHERE schemaname = current_schema() \
             AND relname IN ('outbox_events', 'outbox_aggregates')",
        )
        .await;
        let outbox = counts
            .iter()
            .find(|r| text(&t, r, "name") == "outbox_events")
            .unwrap_or_else(|| panic!("{t}: no statistics for outbox_events in this transaction"));
        assert_eq!(
            (int(&t, outbox, "ins"), int(&t, outbox, "upd"), int(&t, outbox, "del")),
            (4, 0, 0),
            "{t}: one INSERTed row per event, no UPDATE, no DELETE"
        );
        txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(common::count_outbox(&t).await, 4, "{t}");

        logical_decoding_smoke(&t).await;
    })
    .await;
}

/// Reads the inserts back through a temporary logical replication slot (`test_decoding`), when the
/// server runs with `wal_level=logical`; prints why it is skipped otherwise (the server's configuration
/// is not changed by a test).
async fn logical_decoding_smoke(t: &TestDb) {
    let level = query(t, &t.db, "SELECT current_setting('wal_level') AS level").await;
    let level = level.first().map(|r| text(t, r, "level")).unwrap_or_default();
    if level != "logical" {
        eprintln!("{t}: logical decoding smoke skipped: wal_level is {level:?}, not \"logical\"");
        return;
    }
    use sea_orm::sqlx::{self, Row};
    let slot = format!("outbox_smoke_{}", outbox_integration_tests::run_suffix());
    // A temporary slot belongs to the session that made it (and is dropped with it): pin one connection.
    let mut conn = t.db.get_postgres_connection_pool().acquire().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'test_decoding', true)")
        .bind(&slot)
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{t}: create slot: {e}"));
    outbox_seaorm::enqueue(&t.db, &common::event("o3", "order.placed", 5)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let changes = sqlx::query("SELECT data FROM pg_logical_slot_get_changes($1, NULL, NULL)")
        .bind(&slot)
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{t}: read changes: {e}"));
    let _ = sqlx::query("SELECT pg_drop_replication_slot($1)").bind(&slot).execute(&mut *conn).await;
    let lines: Vec<String> = changes.iter().map(|r| r.get::<String, _>("data")).collect();
    let outbox: Vec<&String> = lines.iter().filter(|l| l.contains(".outbox_events:")).collect();
    assert_eq!(outbox.len(), 1, "{t}: one change of outbox_events per event: {lines:#?}");
    assert!(outbox[0].contains(": INSERT:"), "{t}: an INSERT: {}", outbox[0]);
    for column in ["event_id", "aggregate_id", "aggregate_type", "payload", "event_type"] {
        assert!(outbox[0].contains(&format!("{column}[")), "{t}: the change carries {column}: {}", outbox[0]);
    }
}
