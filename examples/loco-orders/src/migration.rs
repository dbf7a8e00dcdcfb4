//! The app's `Migrator`, which Loco runs at start (`auto_migrate`): the outbox tables, then `orders`.

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

/// Creates `orders`.
pub mod m20260101_000001_create_orders {
    use sea_orm_migration::prelude::*;

    /// The migration.
    pub struct Migration;

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
    }

    #[async_trait::async_trait]
    impl MigrationTrait for Migration {
        async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            let orders = Table::create()
                .table(Orders::Table)
                .col(ColumnDef::new(Orders::Id).string_len(64).not_null().primary_key())
                .col(ColumnDef::new(Orders::Customer).string_len(128).not_null())
                .to_owned();
            manager.create_table(orders).await
        }

        async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            manager.drop_table(Table::drop().table(Orders::Table).to_owned()).await
        }
    }
}
