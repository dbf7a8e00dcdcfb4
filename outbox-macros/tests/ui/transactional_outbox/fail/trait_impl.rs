use outbox_seaorm::prelude::*;

pub struct OrderService;

#[transactional_outbox]
impl Clone for OrderService {
    fn clone(&self) -> Self {
        OrderService
    }
}

fn main() {}
