use outbox_seaorm::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct OrderPlacedV1 {
    pub order_id: String,
    pub total: i64,
}

#[derive(Serialize, Deserialize)]
pub struct OrderPlacedV2 {
    pub order_id: String,
    pub total_minor: i64,
}

impl From<OrderPlacedV1> for OrderPlacedV2 {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlacedV2 { order_id: v1.order_id, total_minor: v1.total * 100 }
    }
}

#[derive(DomainEvent, Serialize, Deserialize, Debug, PartialEq)]
#[domain_event(name = "order.placed", version = 3, aggregate = "order", upcast_from(v1 = OrderPlacedV1, v2 = OrderPlacedV2))]
#[serde(rename_all = "camelCase")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
    pub total_minor: i64,
    #[serde(default)]
    pub currency: Option<String>,
}

impl From<OrderPlacedV2> for OrderPlaced {
    fn from(v2: OrderPlacedV2) -> Self {
        OrderPlaced { order_id: v2.order_id, total_minor: v2.total_minor, currency: None }
    }
}

fn main() {
    assert_eq!(<OrderPlaced as DomainEvent>::NAME, "order.placed");
    assert_eq!(<OrderPlaced as DomainEvent>::OLDEST_VERSION, 1);
    let fields: Vec<_> = OrderPlaced::SCHEMA.fields.iter().map(|f| (f.name, f.ty)).collect();
    assert_eq!(fields, [("orderId", "String"), ("totalMinor", "i64"), ("currency", "Option<String>")]);
    let old = OrderPlaced::decode_version(1, r#"{"order_id":"o1","total":5}"#).unwrap();
    assert_eq!(old, OrderPlaced { order_id: "o1".into(), total_minor: 500, currency: None });
    let event = OrderPlaced { order_id: "o9".into(), total_minor: 1, currency: None };
    assert_eq!(event.aggregate_id(), "o9");
    let new_event = event.to_new_event().unwrap();
    assert_eq!(new_event.schema_version(), 3);
}
