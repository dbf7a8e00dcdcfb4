//! The app's own tables as SeaORM entities; [`crate::migration`] creates them.

/// `orders`: one row per placed order.
pub mod order {
    use sea_orm::entity::prelude::*;
    use serde::Serialize;

    /// A placed order.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize)]
    #[sea_orm(table_name = "orders")]
    pub struct Model {
        /// Chosen by the client, so a retried `POST /orders` cannot place the order twice.
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        /// Who ordered.
        pub customer: String,
        /// The total in minor units (cents).
        pub total_minor: i64,
    }

    /// No relations.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// `invoices`: written by billing, one per `order.placed` event.
pub mod invoice {
    use sea_orm::entity::prelude::*;
    use serde::Serialize;

    /// An invoice. `order_id` is deliberately not unique: the inbox is what keeps an order from being
    /// billed twice when the broker delivers its event twice.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize)]
    #[sea_orm(table_name = "invoices")]
    pub struct Model {
        /// Assigned by the database.
        #[sea_orm(primary_key)]
        pub id: i64,
        /// The order billed.
        pub order_id: String,
        /// The amount in minor units (cents).
        pub total_minor: i64,
    }

    /// No relations.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
