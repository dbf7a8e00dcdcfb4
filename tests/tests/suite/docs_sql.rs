//! docs/how-it-works.md prints the statements the store runs, per backend: the claim's (from
//! `SeaOrmStore::claim_plans`) and those that write or lock by key (from `SeaOrmStore::lock_plans`). The
//! printed text is rendered from the code here, so it cannot drift: when a statement changes, this test fails
//! until the docs are rendered again with `OUTBOX_RENDER_DOCS=1 cargo test -p outbox-integration-tests --test
//! docs_sql -- --test-threads=1`.

use crate::common;

use std::path::PathBuf;

use common::{enqueue_committed, event};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::ClaimPlan;
use outbox_seaorm::{DeadLetterPolicy, SeaOrmStore};

fn docs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/how-it-works.md")
}

/// `sql` with long lists of placeholders shortened (`$2, $3, …, $501`: the statements by key are explained
/// with 500 keys) and a line break before its main clauses, for reading (the statement itself is one line).
fn readable(sql: &str) -> String {
    let mut out = shorten_lists(sql);
    for clause in [
        " FROM ",
        " WHERE ",
        " ORDER BY ",
        " LIMIT ",
        " UNION ALL ",
        " FOR UPDATE",
        " RETURNING ",
        " SET ",
        " ON CONFLICT",
        " JOIN ",
    ] {
        out = out.replace(clause, &format!("\n {}", clause.trim_start()));
    }
    out
}

/// Runs of more than three list items of one shape (`$7`, `?`, `(?, ?)`) as the first two, `…` and the last.
fn shorten_lists(sql: &str) -> String {
    let items: Vec<&str> = sql.split(", ").collect();
    let shape = |item: &str| item.replace(|c: char| c.is_ascii_digit(), "");
    let shapes: Vec<String> = items.iter().map(|item| shape(item)).collect();
    let mut out: Vec<&str> = Vec::new();
    let mut i = 0;
    'items: while i < items.len() {
        for period in [1, 2] {
            let same = |k: usize| (0..period).all(|j| shapes.get(i + k * period + j) == shapes.get(i + j));
            let mut repeats = 1;
            while i + (repeats + 1) * period <= items.len() && same(repeats) {
                repeats += 1;
            }
            if repeats > 3 {
                out.extend(&items[i..i + 2 * period]);
                out.push("…");
                out.extend(&items[i + (repeats - 1) * period..i + repeats * period]);
                i += repeats * period;
                continue 'items;
            }
        }
        out.push(items[i]);
        i += 1;
    }
    out.join(", ")
}

/// The block of `backend` as the docs hold it: each statement's name as a comment, then its SQL.
fn block(backend: &str, claim: &[ClaimPlan], by_key: &[ClaimPlan]) -> String {
    let mut text = format!("<!-- statements: {backend} (rendered by tests/tests/suite/docs_sql.rs) -->\n```sql\n");
    for (part, plans) in [("claim", claim), ("by key", by_key)] {
        for plan in plans {
            text.push_str(&format!("-- {part}: {}\n{};\n", plan.statement, readable(&plan.sql)));
        }
    }
    text.push_str(&format!("```\n<!-- /statements: {backend} -->"));
    text
}

async fn the_statements_in_the_docs_are_the_ones_the_store_runs(t: TestDb) {
    // Two aggregates with a pending event each: the claim explains its candidates and their runs.
    enqueue_committed(&t, &[event("o1", "placed", 1), event("o2", "placed", 2)]).await;
    let store = SeaOrmStore::new(t.db.clone());
    let claim = store.claim_plans(100, DeadLetterPolicy::BlockAggregate).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let by_key = store.lock_plans().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let backend = t.to_string();
    let rendered = block(&backend, &claim, &by_key);

    let path = docs();
    let docs = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (open, close) = (format!("<!-- statements: {backend} "), format!("<!-- /statements: {backend} -->"));
    let printed = docs.find(&open).and_then(|start| {
        let end = docs[start..].find(&close)? + start + close.len();
        Some((start, end))
    });
    if std::env::var("OUTBOX_RENDER_DOCS").is_ok_and(|v| v == "1") {
        let updated = match printed {
            Some((start, end)) => format!("{}{rendered}{}", &docs[..start], &docs[end..]),
            None => format!("{}\n{rendered}\n", docs.trim_end()),
        };
        std::fs::write(&path, updated).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let Some((start, end)) = printed else {
        panic!("{t}: docs/how-it-works.md prints no statements for {backend}; render them (see this file's header)")
    };
    assert_eq!(
        &docs[start..end],
        rendered,
        "{t}: docs/how-it-works.md prints other statements than the store runs; render them again (see this \
         file's header)"
    );
}
per_backend!(the_statements_in_the_docs_are_the_ones_the_store_runs, "docs_sql");
