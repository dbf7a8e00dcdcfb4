// Every entry of `order.placed` is locked in events.lock next to this file: v1 and v2 through their
// `upcast_from` structs, v3 with the fields of `Address` and `Kind`. `std::string::String` is `String` there.
use outbox_seaorm::{DomainEvent, PayloadSchema};
use serde::{Deserialize, Serialize};

#[derive(PayloadSchema, Serialize, Deserialize)]
pub struct OrderPlacedV1 {
    pub order_id: std::string::String,
    pub total: i64,
}

#[derive(PayloadSchema, Serialize, Deserialize)]
pub struct OrderPlacedV2 {
    pub order_id: String,
    pub total_minor: i64,
}

impl From<OrderPlacedV1> for OrderPlacedV2 {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlacedV2 { order_id: v1.order_id, total_minor: v1.total * 100 }
    }
}

#[derive(PayloadSchema, Serialize, Deserialize, Debug, PartialEq)]
pub struct Address {
    pub street: String,
    pub kind: Kind,
}

#[derive(PayloadSchema, Serialize, Deserialize, Debug, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Home,
    Office { floor: u8 },
}

#[derive(DomainEvent, Serialize, Deserialize, Debug, PartialEq)]
#[domain_event(name = "order.placed", version = 3, aggregate = "order", upcast_from(v1 = OrderPlacedV1, v2 = OrderPlacedV2))]
#[serde(rename_all = "camelCase")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
    pub total_minor: i64,
    #[serde(default)]
    pub currency: ::std::option::Option<std::string::String>,
    #[serde(default)]
    pub ship_to: Option<Address>,
}

impl From<OrderPlacedV2> for OrderPlaced {
    fn from(v2: OrderPlacedV2) -> Self {
        OrderPlaced { order_id: v2.order_id, total_minor: v2.total_minor, currency: None, ship_to: None }
    }
}

fn main() {
    assert_eq!(<OrderPlaced as DomainEvent>::NAME, "order.placed");
    assert_eq!(<OrderPlaced as DomainEvent>::OLDEST_VERSION, 1);
    let fields: Vec<_> = OrderPlaced::SCHEMA.fields.iter().map(|f| (f.name, f.ty)).collect();
    assert_eq!(
        fields,
        [("orderId", "String"), ("totalMinor", "i64"), ("currency", "Option<String>"), ("shipTo", "Option<Address>")]
    );
    let older: Vec<_> = OrderPlaced::SCHEMA.upcast_from.iter().map(|s| (s.version, s.type_name)).collect();
    assert_eq!(older, [(1, "OrderPlacedV1"), (2, "OrderPlacedV2")]);
    let old = OrderPlaced::decode_version(1, r#"{"order_id":"o1","total":5}"#).unwrap();
    assert_eq!(old, OrderPlaced { order_id: "o1".into(), total_minor: 500, currency: None, ship_to: None });
    let event = OrderPlaced { order_id: "o9".into(), total_minor: 1, currency: None, ship_to: None };
    assert_eq!(event.aggregate_id(), "o9");
    let new_event = event.to_new_event().unwrap();
    assert_eq!(new_event.schema_version(), 3);
}
