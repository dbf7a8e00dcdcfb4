//! Named database locks, so that maintenance every replica runs (cleanup, migrations) runs in one at a
//! time: `pg_try_advisory_lock` on PostgreSQL, `GET_LOCK` on MySQL/MariaDB.
//!
//! Both are session locks, so each lives on a connection of its own, taken from the pool and never
//! returned to it: releasing unlocks and closes it, and dropping it unreleased closes it too, which makes
//! the server let the lock go. A panic or a cancelled task can therefore not leave a lock behind on a
//! pooled connection. The lock is named after the database and schema, so outboxes in different schemas
//! of one server do not exclude each other. SQLite needs no lock ([`StoreLock::local`]): its writers take
//! turns on the file.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};

use outbox_runtime::store::StoreLock;

/// Tries to take the lock `name` without waiting; `None` when another session holds it.
pub(crate) async fn try_lock(db: &DatabaseConnection, name: &str) -> Result<Option<StoreLock>, DbErr> {
    if db.is_mock_connection() {
        return Ok(Some(StoreLock::local()));
    }
    match db.get_database_backend() {
        #[cfg(feature = "sqlx-postgres")]
        sea_orm::DbBackend::Postgres => postgres::try_lock(db, name).await,
        #[cfg(feature = "sqlx-mysql")]
        sea_orm::DbBackend::MySql => mysql::try_lock(db, name).await,
        _ => {
            let _ = name;
            Ok(Some(StoreLock::local()))
        }
    }
}

#[cfg(feature = "migrations")]
/// Takes the lock `name`, trying every 100 ms for up to `wait`; `None` when it stayed taken that long.
pub(crate) async fn lock(
    db: &DatabaseConnection,
    name: &str,
    wait: std::time::Duration,
) -> Result<Option<StoreLock>, DbErr> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some(lock) = try_lock(db, name).await? {
            return Ok(Some(lock));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tracing::debug!(lock = name, "waiting for a database lock another process holds");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-mysql"))]
fn sqlx_err(error: sea_orm::sqlx::Error) -> DbErr {
    DbErr::Query(sea_orm::RuntimeErr::SqlxError(std::sync::Arc::new(error)))
}

#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-mysql"))]
fn release_error(backend: sea_orm::DbBackend, source: DbErr) -> outbox_runtime::Error {
    crate::error::store_error("release a database lock", "-", backend, source)
}

#[cfg(feature = "sqlx-postgres")]
mod postgres {
    use sea_orm::sqlx;

    use super::*;

    // A 64-bit key from the database, the schema and the name (`hashtextextended`, PostgreSQL 11+).
    const TRY_LOCK: &str = "SELECT pg_try_advisory_lock(hashtextextended(current_database() || '.' || \
        COALESCE(current_schema(), '') || '.' || $1, 0))";
    const UNLOCK: &str = "SELECT pg_advisory_unlock(hashtextextended(current_database() || '.' || \
        COALESCE(current_schema(), '') || '.' || $1, 0))";

    pub(super) async fn try_lock(db: &DatabaseConnection, name: &str) -> Result<Option<StoreLock>, DbErr> {
        let mut conn = db.get_postgres_connection_pool().acquire().await.map_err(sqlx_err)?;
        let locked: bool = sqlx::query_scalar(TRY_LOCK).bind(name).fetch_one(&mut *conn).await.map_err(sqlx_err)?;
        if !locked {
            return Ok(None); // the connection goes back to the pool holding nothing
        }
        conn.close_on_drop();
        let name = name.to_owned();
        Ok(Some(StoreLock::new(move || async move {
            let unlocked = sqlx::query_scalar::<_, bool>(UNLOCK).bind(&name).fetch_one(&mut *conn).await;
            drop(conn); // closed, not pooled: the session's locks end with it whatever the unlock said
            unlocked.map(|_| ()).map_err(|e| release_error(sea_orm::DbBackend::Postgres, sqlx_err(e)))
        })))
    }
}

#[cfg(feature = "sqlx-mysql")]
mod mysql {
    use sea_orm::sqlx;

    use super::*;

    pub(super) async fn try_lock(db: &DatabaseConnection, name: &str) -> Result<Option<StoreLock>, DbErr> {
        let mut conn = db.get_mysql_connection_pool().acquire().await.map_err(sqlx_err)?;
        // Lock names are server-wide and at most 64 characters: the database's name goes in, hashed when
        // too long.
        let full: String = sqlx::query_scalar(
            "SELECT IF(CHAR_LENGTH(n) <= 64, n, CONCAT('outbox.', SHA1(n))) FROM \
             (SELECT CONCAT('outbox.', COALESCE(DATABASE(), ''), '.', ?) AS n) AS x",
        )
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .map_err(sqlx_err)?;
        let locked: Option<i64> = sqlx::query_scalar("SELECT CAST(GET_LOCK(?, 0) AS SIGNED)")
            .bind(&full)
            .fetch_one(&mut *conn)
            .await
            .map_err(sqlx_err)?;
        if locked != Some(1) {
            return Ok(None);
        }
        conn.close_on_drop();
        Ok(Some(StoreLock::new(move || async move {
            let released = sqlx::query_scalar::<_, Option<i64>>("SELECT CAST(RELEASE_LOCK(?) AS SIGNED)")
                .bind(&full)
                .fetch_one(&mut *conn)
                .await;
            drop(conn);
            released.map(|_| ()).map_err(|e| release_error(sea_orm::DbBackend::MySql, sqlx_err(e)))
        })))
    }
}
