//! `outbox migrate`: the outbox migrations, safe when several replicas start at once.

use outbox_seaorm::admin;
use sea_orm::DatabaseConnection;

use crate::CliError;
use crate::db::ready_to_write_unmigrated;

/// Applies the pending migrations and says which.
pub async fn run(db: &DatabaseConnection) -> Result<(), CliError> {
    ready_to_write_unmigrated(db).await?;
    let pending = admin::pending_migrations(db, None).await?;
    outbox_seaorm::migrate(db).await?;
    match pending.len() {
        0 => println!("outbox migrations: all applied already"),
        n => println!("outbox migrations: applied {n} ({})", pending.join(", ")),
    }
    Ok(())
}
