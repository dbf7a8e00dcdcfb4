//! The consumer's inbox: each `(consumer, message id)` has its effect at most once, and an effect that fails
//! leaves no trace, so the message can be retried.

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{count_inbox, count_table, create_shop_tables, insert_invoice};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::limits::MAX_CONSUMER_LEN;
use outbox_seaorm::limits::MAX_MESSAGE_ID_LEN;
use outbox_seaorm::{EventId, InboxError, InboxOutcome};
use sea_orm::{DatabaseConnection, TransactionTrait};

/// Delivers `message_id` to `consumer`, whose effect invoices order `o1`; counts effect runs in `runs`.
async fn deliver(
    db: &DatabaseConnection,
    consumer: &str,
    message_id: &str,
    runs: &AtomicU32,
) -> Result<InboxOutcome<()>, InboxError<sea_orm::DbErr>> {
    outbox_seaorm::handle_once(db, consumer, message_id, async |txn| {
        runs.fetch_add(1, Ordering::SeqCst);
        insert_invoice(txn, "o1", 4900).await
    })
    .await
}

async fn a_message_has_its_effect_once_per_consumer(t: TestDb) {
    create_shop_tables(&t).await;
    let id = EventId::new().to_string();
    let runs = AtomicU32::new(0);

    let first = deliver(&t.db, "billing", &id, &runs).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(first, InboxOutcome::Processed(()), "{t}");
    let again = deliver(&t.db, "billing", &id, &runs).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(again, InboxOutcome::Duplicate, "{t}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{t}: a duplicate must not run the effect");
    assert_eq!(count_table(&t, "invoices").await, 1, "{t}");

    // Another consumer of the same message has its own inbox entry.
    let other = deliver(&t.db, "shipping", &id, &runs).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(other, InboxOutcome::Processed(()), "{t}");
    assert_eq!(count_inbox(&t, "billing").await, 1, "{t}");
    assert_eq!(count_inbox(&t, "shipping").await, 1, "{t}");
    assert_eq!(count_table(&t, "invoices").await, 2, "{t}");
}
per_backend!(a_message_has_its_effect_once_per_consumer, "inbox_once_per_consumer");

async fn a_failing_effect_rolls_back_its_writes_and_the_inbox_row_so_a_retry_runs_it(t: TestDb) {
    create_shop_tables(&t).await;
    let id = EventId::new().to_string();
    let result = outbox_seaorm::handle_once(&t.db, "billing", &id, async |txn| {
        insert_invoice(txn, "o1", 4900).await.map_err(|e| e.to_string())?;
        Err::<(), String>("payment provider unavailable".to_owned())
    })
    .await;
    match result {
        Err(InboxError::Effect(message)) => assert_eq!(message, "payment provider unavailable", "{t}"),
        other => panic!("{t}: expected the effect's error, got {other:?}"),
    }
    assert_eq!(count_table(&t, "invoices").await, 0, "{t}: the effect's write rolled back");
    assert_eq!(count_inbox(&t, "billing").await, 0, "{t}: the inbox row rolled back with it");

    let runs = AtomicU32::new(0);
    let retry = deliver(&t.db, "billing", &id, &runs).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(retry, InboxOutcome::Processed(()), "{t}: the retry is not a duplicate");
    assert_eq!(count_table(&t, "invoices").await, 1, "{t}");
    assert_eq!(count_inbox(&t, "billing").await, 1, "{t}");
}
per_backend!(
    a_failing_effect_rolls_back_its_writes_and_the_inbox_row_so_a_retry_runs_it,
    "inbox_effect_error_rolls_back"
);

async fn invalid_consumer_or_message_ids_are_typed_errors_and_write_nothing(t: TestDb) {
    create_shop_tables(&t).await;
    let id = EventId::new().to_string();
    let long_consumer = "c".repeat(MAX_CONSUMER_LEN + 1);
    let long_id = "m".repeat(MAX_MESSAGE_ID_LEN + 1);
    let cases = [
        ("", id.as_str(), "consumer"),
        ("   ", id.as_str(), "consumer"),
        (long_consumer.as_str(), id.as_str(), "consumer"),
        ("billing", "", "message_id"),
        ("billing", long_id.as_str(), "message_id"),
    ];
    let runs = AtomicU32::new(0);
    for (consumer, message_id, field) in cases {
        match deliver(&t.db, consumer, message_id, &runs).await {
            Err(InboxError::Outbox(outbox_seaorm::Error::InvalidEvent { field: got, .. })) => {
                assert_eq!(got, field, "{t}: consumer {consumer:?}, message id {message_id:?}")
            }
            other => {
                panic!("{t}: consumer {consumer:?}, message id {message_id:?}: expected InvalidEvent, got {other:?}")
            }
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "{t}: no effect ran");
    assert_eq!(count_table(&t, "inbox_messages").await, 0, "{t}");
    assert_eq!(count_table(&t, "invoices").await, 0, "{t}");

    // The longest keys the columns hold are fine.
    let consumer = "c".repeat(MAX_CONSUMER_LEN);
    let message_id = "m".repeat(MAX_MESSAGE_ID_LEN);
    let outcome = deliver(&t.db, &consumer, &message_id, &runs).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(outcome, InboxOutcome::Processed(()), "{t}");
    let outcome = deliver(&t.db, &consumer, &message_id, &runs).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(outcome, InboxOutcome::Duplicate, "{t}");
}
per_backend!(invalid_consumer_or_message_ids_are_typed_errors_and_write_nothing, "inbox_invalid_keys");

async fn inside_a_callers_transaction_the_inbox_commits_or_rolls_back_with_it(t: TestDb) {
    create_shop_tables(&t).await;
    let id = EventId::new().to_string();
    let runs = AtomicU32::new(0);
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let outcome = outbox_seaorm::handle_once(&txn, "billing", &id, async |inner| {
        runs.fetch_add(1, Ordering::SeqCst);
        insert_invoice(inner, "o1", 4900).await
    })
    .await
    .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(outcome, InboxOutcome::Processed(()), "{t}");
    let outcome = outbox_seaorm::handle_once(&txn, "billing", &id, async |inner| {
        runs.fetch_add(1, Ordering::SeqCst);
        insert_invoice(inner, "o1", 4900).await
    })
    .await
    .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(outcome, InboxOutcome::Duplicate, "{t}: the duplicate is seen inside the same transaction");
    txn.rollback().await.unwrap_or_else(|e| panic!("{t}: {e}"));

    assert_eq!(runs.load(Ordering::SeqCst), 1, "{t}");
    assert_eq!(count_inbox(&t, "billing").await, 0, "{t}: rolled back with the caller's transaction");
    assert_eq!(count_table(&t, "invoices").await, 0, "{t}");
    let outcome = deliver(&t.db, "billing", &id, &AtomicU32::new(0)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(outcome, InboxOutcome::Processed(()), "{t}: so a later delivery processes it");
}
per_backend!(inside_a_callers_transaction_the_inbox_commits_or_rolls_back_with_it, "inbox_in_callers_transaction");

/// Two deliveries of one message at the same time, on two pools: one runs the effect, the other waits for
/// it and sees a duplicate.
async fn concurrent_deliveries(t: &TestDb) {
    let id = EventId::new().to_string();
    let runs = AtomicU32::new(0);
    let other_pool = t.reconnect().await;
    let slow = outbox_seaorm::handle_once(&t.db, "billing", &id, async |txn| {
        runs.fetch_add(1, Ordering::SeqCst);
        insert_invoice(txn, "o1", 4900).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok::<_, sea_orm::DbErr>(())
    });
    let late = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        deliver(&other_pool, "billing", &id, &runs).await
    };
    let (slow, late) = tokio::join!(slow, late);
    let mut outcomes = [
        slow.unwrap_or_else(|e| panic!("{t}: {e}")).is_processed(),
        late.unwrap_or_else(|e| panic!("{t}: {e}")).is_processed(),
    ];
    outcomes.sort();
    assert_eq!(outcomes, [false, true], "{t}: exactly one delivery processes the message");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{t}");
    assert_eq!(count_table(t, "invoices").await, 1, "{t}");
}

async fn concurrent_deliveries_of_one_message_have_one_effect(t: TestDb) {
    create_shop_tables(&t).await;
    concurrent_deliveries(&t).await;
}
per_backend!(concurrent_deliveries_of_one_message_have_one_effect, "inbox_concurrent_deliveries");
