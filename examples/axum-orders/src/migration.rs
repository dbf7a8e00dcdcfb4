//! The app's `Migrator`: outbox-seaorm's migrations (outbox, aggregates, inbox) plus the app's own tables,
//! under one bookkeeping table, as an app with its own migrations would do.

use sea_orm_migration::prelude::*;

/// Every migration of the app, oldest first.
pub struct Migrator;

impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        let mut migrations = outbox_seaorm::migrations();
        migrations.push(Box::new(m20260101_000001_create_orders::Migration));
        migrations
    }
}

/// Creates `orders` and `invoices`.
pub mod m20260101_000001_create_orders {
    use sea_orm_migration::prelude::*;

    /// The migration.
    pub struct Migration;

    // Spelled out: `DeriveMigrationName` would name it after the file (`migration`), and a recorded name
    // can never change.
    impl MigrationName for Migration {
        fn name(&self) -> &str {
            "m20260101_000001_create_orders"
        }
    }

    #[derive(DeriveIden)]
    enum Orders {
        Table,
        Id,
        Customer,
        TotalMinor,
    }

    #[derive(DeriveIden)]
    enum Invoices {
        Table,
        Id,
        OrderId,
        TotalMinor,
    }

    #[async_trait::async_trait]
    impl MigrationTrait for Migration {
        async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            manager
                .create_table(
                    Table::create()
                        .table(Orders::Table)
                        .col(ColumnDef::new(Orders::Id).string_len(64).not_null().primary_key())
                        .col(ColumnDef::new(Orders::Customer).string_len(128).not_null())
                        .col(ColumnDef::new(Orders::TotalMinor).big_integer().not_null())
                        .to_owned(),
                )
                .await?;
            manager
                .create_table(
                    Table::create()
                        .table(Invoices::Table)
                        .col(ColumnDef::new(Invoices::Id).big_integer().not_null().auto_increment().primary_key())
                        .col(ColumnDef::new(Invoices::OrderId).string_len(64).not_null())
                        .col(ColumnDef::new(Invoices::TotalMinor).big_integer().not_null())
                        .to_owned(),
                )
                .await
        }

        async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            manager.drop_table(Table::drop().table(Invoices::Table).to_owned()).await?;
            manager.drop_table(Table::drop().table(Orders::Table).to_owned()).await
        }
    }
}
