//! The cases, one generated test each (see [`contract_suite!`](crate::contract_suite)).

use super::*;

async fn begin<F: Fixture>(case: &str) -> Option<(TestDb, F)> {
    if !crate::proxy::server_available(F::NAME, F::ADDRESS).await {
        return None;
    }
    crate::log_to_test_output();
    let t = case_db(&format!("ct_{}_{case}", F::TAG)).await;
    Some((t, F::setup(case).await))
}

/// Every event crosses the broker once and is applied once, in order per aggregate.
pub async fn round_trip<F: Fixture>() {
    let Some((t, fx)) = begin::<F>("round_trip").await else { return };
    enqueue(&t, &counted_events(8, 5)).await;
    relay_all(&t, &fx, 40).await;
    let (consumer, applied) = counting_consumer(&t, "rt", fast_config(), |_, _| false);
    let running = Running::start(consumer, fx.transport("rt").await);
    eventually(Duration::from_secs(30), "40 effects", async || effects(&t, "rt").await.len() == 40).await;
    let stats = running.stop().await;
    assert_eq!(stats.processed, 40, "{}: {stats:?}", F::NAME);
    assert_eq!(stats.dead_lettered, 0, "{}: {stats:?}", F::NAME);
    assert!(stats.groups > 0 && stats.groups < stats.processed, "{}: applied in groups: {stats:?}", F::NAME);
    assert_eq!(crate::count_inbox(&t, "rt").await, 40, "{}", F::NAME);
    applied.assert_in_order(F::NAME);
    // The groups' acks (pipelined where the broker allows) reached the broker: a consumer that takes
    // over the group gets the next event and nothing of the 40 again.
    enqueue(&t, &[Counted { item: "after".into(), n: 0 }.to_new_event().expect("valid event")]).await;
    relay_all(&t, &fx, 1).await;
    let (next, _) = counting_consumer(&t, "rt", fast_config(), |_, _| false);
    let running = Running::start(next, fx.transport("rt").await);
    eventually(Duration::from_secs(60), "the next event", async || effects(&t, "rt").await.len() == 41).await;
    let stats = running.stop().await;
    assert_eq!((stats.processed, stats.duplicates), (1, 0), "{}: nothing redelivered: {stats:?}", F::NAME);
    fx.teardown().await;
}

/// 1,000 events over 50 aggregates, 10 % of deliveries failing at random after writing their effect:
/// every event applied exactly once, first applications in order per aggregate, nothing dead.
pub async fn random_failures_keep_order<F: Fixture>() {
    random_failures::<F>("random_failures", "rf", |t, name, config, fail| counting_consumer(t, name, config, fail))
        .await;
}

/// [`random_failures_keep_order`] with a batch handler (a group's messages in one call, one effect
/// statement): a failing call rolls its group back and its messages run alone; still each event once, in
/// order.
pub async fn batch_handler_random_failures_keep_order<F: Fixture>() {
    random_failures::<F>("batch_failures", "bf", |t, name, config, fail| {
        counting_batch_consumer(t, name, config, fail)
    })
    .await;
}

/// Decides at random (10 %, a fixed seed) whether a delivery fails.
type Fail = Box<dyn Fn(&Counted, u32) -> bool + Send + Sync>;

async fn random_failures<F: Fixture>(
    case: &str,
    name: &str,
    consumer: impl FnOnce(&TestDb, &str, ConsumerConfig, Fail) -> (Consumer, Applications),
) {
    let Some((t, fx)) = begin::<F>(case).await else { return };
    enqueue(&t, &counted_events(50, 20)).await;
    relay_all(&t, &fx, 1_000).await;
    let seed = std::sync::atomic::AtomicU64::new(0x9e37_79b9_7f4a_7c15);
    let fail = move |_: &Counted, _: u32| {
        let mut x = seed.load(std::sync::atomic::Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        seed.store(x, std::sync::atomic::Ordering::Relaxed);
        x.is_multiple_of(10)
    };
    let config = fast_config().with_max_deliveries(1_000);
    let (consumer, applied) = consumer(&t, name, config, Box::new(fail));
    let running = Running::start(consumer, fx.transport(name).await);
    eventually(Duration::from_secs(120), "1000 effects", async || effects(&t, name).await.len() == 1_000).await;
    let stats = running.stop().await;
    let unique: HashSet<_> = effects(&t, name).await.into_iter().collect();
    assert_eq!(unique.len(), 1_000, "{}: each event applied once", F::NAME);
    assert!(stats.retried > 0, "{}: the failures were injected: {stats:?}", F::NAME);
    assert!(stats.group_rollbacks > 0, "{}: failures inside groups rolled them back: {stats:?}", F::NAME);
    assert_eq!(stats.dead_lettered, 0, "{}: {stats:?}", F::NAME);
    applied.assert_in_order(F::NAME);
    fx.teardown().await;
}

/// Messages that are not outbox messages are dead-lettered with their reason, and the messages after
/// them are processed: published = applied + dead-lettered.
pub async fn poison_messages_are_dead_lettered<F: Fixture>() {
    let Some((t, fx)) = begin::<F>("poison").await else { return };
    enqueue(&t, &counted_events(2, 2)).await;
    relay_all(&t, &fx, 4).await;
    fx.publish_raw(&[], b"not an outbox message").await;
    let mut headers = outbox_seaorm::broker::envelope_headers(&outbox_sample());
    for (name, value) in &mut headers {
        if name == "ce_time" {
            *value = "yesterday".to_owned();
        }
    }
    fx.publish_raw(&headers, br#"{"item":"it0","n":9}"#).await;
    enqueue(&t, &counted_events(2, 3)[4..]).await;
    relay_all(&t, &fx, 2).await;
    let (consumer, _) = counting_consumer(&t, "pm", fast_config(), |_, _| false);
    let running = Running::start(consumer, fx.transport("pm").await);
    eventually(Duration::from_secs(30), "6 effects and 2 dead letters", async || {
        effects(&t, "pm").await.len() == 6 && running.stats().dead_lettered == 2
    })
    .await;
    let stats = running.stop().await;
    let dead = fx.dead_letters("pm").await;
    assert_eq!(dead.len(), 2, "{}: {dead:?}", F::NAME);
    let reasons: Vec<&str> = dead.iter().filter_map(|(h, _)| h.get("outbox_dead_reason").map(String::as_str)).collect();
    assert!(reasons.iter().any(|r| r.contains("ce_id")), "{}: {reasons:?}", F::NAME);
    assert!(reasons.iter().any(|r| r.contains("ce_time")), "{}: {reasons:?}", F::NAME);
    assert!(dead.iter().any(|(_, p)| p == b"not an outbox message"), "{}: the payload is kept", F::NAME);
    assert_eq!(stats.processed + stats.dead_lettered, 8, "{}: {stats:?}", F::NAME);
    fx.teardown().await;
}

/// A handler that panics on one event: the consumer keeps going, the event is dead-lettered after
/// `max_deliveries` with the panic as its reason, and a replay after the fix applies it once.
pub async fn panicking_handler_then_replay<F: Fixture>() {
    let Some((t, fx)) = begin::<F>("panic_replay").await else { return };
    enqueue(&t, &counted_events(3, 3)).await;
    relay_all(&t, &fx, 9).await;
    let config = fast_config().with_max_deliveries(3);
    let (consumer, _) = counting_consumer(&t, "ph", config.clone(), |e, _| {
        assert!(!(e.item == "it1" && e.n == 1), "bug in the handler for it1/1");
        false
    });
    let running = Running::start(consumer, fx.transport("ph").await);
    // it1/1 is dead, so it1/2 follows it (the dead letter ends the wait of its lane).
    eventually(Duration::from_secs(30), "8 effects and 1 dead letter", async || {
        effects(&t, "ph").await.len() == 8 && running.stats().dead_lettered == 1
    })
    .await;
    let stats = running.stop().await;
    assert_eq!(stats.retried, 2, "{}: 3 deliveries, 2 retries: {stats:?}", F::NAME);
    let dead = fx.dead_letters("ph").await;
    assert_eq!(dead.len(), 1, "{}", F::NAME);
    let reason = dead[0].0.get("outbox_dead_reason").cloned().unwrap_or_default();
    assert!(reason.contains("panicked") && reason.contains("it1/1"), "{}: {reason}", F::NAME);
    assert_eq!(dead[0].0.get("outbox_dead_attempts").map(String::as_str), Some("3"), "{}", F::NAME);
    assert_eq!(fx.replay("ph").await, 1, "{}: one dead letter replayed", F::NAME);
    let (fixed, _) = counting_consumer(&t, "ph", config, |_, _| false);
    let running = Running::start(fixed, fx.transport("ph").await);
    eventually(Duration::from_secs(30), "the replayed event applied", async || effects(&t, "ph").await.len() == 9)
        .await;
    let stats = running.stop().await;
    assert_eq!(effects(&t, "ph").await.iter().filter(|(i, n)| i == "it1" && *n == 1).count(), 1, "{}", F::NAME);
    assert_eq!(stats.dead_lettered, 0, "{}: {stats:?}", F::NAME);
    fx.teardown().await;
}

/// A v3 event at a consumer that knows v2: not applied, not dead-lettered, not lost; applied once by
/// the upgraded consumer.
pub async fn newer_version_waits_for_the_upgrade<F: Fixture>() {
    let Some((t, fx)) = begin::<F>("newer_version").await else { return };
    let v3 = CountedV3 { item: "it0".into(), n: 0, note: "new".into() }.to_new_event().expect("v3 event");
    enqueue(&t, &[v3]).await;
    enqueue(&t, &counted_events(2, 1)[1..]).await;
    relay_all(&t, &fx, 2).await;
    let (old, _) = counting_consumer(&t, "nv", fast_config(), |_, _| false);
    let running = Running::start(old, fx.transport("nv").await);
    eventually(Duration::from_secs(30), "it1 applied and the v3 event retried", async || {
        effects(&t, "nv").await.len() == 1 && running.stats().newer_version >= 3
    })
    .await;
    let stats = running.stop().await;
    assert_eq!(effects(&t, "nv").await, vec![("it1".to_owned(), 0)], "{}", F::NAME);
    assert_eq!(stats.dead_lettered, 0, "{}: {stats:?}", F::NAME);
    assert!(fx.dead_letters("nv").await.is_empty(), "{}", F::NAME);

    let db = t.db.clone();
    let upgraded = Consumer::new("nv").with_config(fast_config()).on::<CountedV3>(move |r: Received<CountedV3>| {
        let db = db.clone();
        async move { apply(&db, "nv", &r.envelope.id.to_string(), &r.event.item, r.event.n).await.map(|_| ()) }
    });
    let running = Running::start(upgraded, fx.transport("nv").await);
    eventually(Duration::from_secs(30), "the v3 event applied", async || effects(&t, "nv").await.len() == 2).await;
    running.stop().await;
    assert_eq!(crate::count_inbox(&t, "nv").await, 2, "{}", F::NAME);
    fx.teardown().await;
}

/// An event type this consumer has no handler for is acked untouched, and never comes back.
pub async fn unhandled_types_are_skipped<F: Fixture>() {
    let Some((t, fx)) = begin::<F>("unhandled").await else { return };
    let ignored: Vec<NewEvent> =
        (0..3).map(|i| Ignored { item: format!("it{i}") }.to_new_event().expect("event")).collect();
    enqueue(&t, &ignored).await;
    enqueue(&t, &counted_events(3, 1)).await;
    relay_all(&t, &fx, 6).await;
    let (consumer, _) = counting_consumer(&t, "un", fast_config(), |_, _| false);
    let running = Running::start(consumer, fx.transport("un").await);
    eventually(Duration::from_secs(30), "3 effects, 3 skipped", async || {
        effects(&t, "un").await.len() == 3 && running.stats().skipped == 3
    })
    .await;
    running.stop().await;
    let (again, _) = counting_consumer(&t, "un", fast_config(), |_, _| false);
    let running = Running::start(again, fx.transport("un").await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = running.stop().await;
    assert_eq!(stats.skipped + stats.processed + stats.duplicates, 0, "{}: acked means gone: {stats:?}", F::NAME);
    assert!(fx.dead_letters("un").await.is_empty(), "{}", F::NAME);
    fx.teardown().await;
}

/// The consumer dies after its commits and before its acks: the broker redelivers everything, the
/// inbox absorbs every redelivery, each effect stays applied once.
pub async fn killed_between_commit_and_ack<F: Fixture>() {
    let Some((t, fx)) = begin::<F>("lost_ack").await else { return };
    enqueue(&t, &counted_events(4, 5)).await;
    relay_all(&t, &fx, 20).await;
    let (consumer, _) = counting_consumer(&t, "la", fast_config(), |_, _| false);
    let running = Running::start(consumer, LosingAcks(fx.transport("la").await));
    eventually(Duration::from_secs(30), "20 effects", async || effects(&t, "la").await.len() == 20).await;
    running.stop().await;
    let (again, _) = counting_consumer(&t, "la", fast_config(), |_, _| false);
    let running = Running::start(again, fx.transport("la").await);
    eventually(Duration::from_secs(60), "20 redeliveries absorbed", async || running.stats().duplicates >= 20).await;
    let stats = running.stop().await;
    assert_eq!(stats.processed, 0, "{}: {stats:?}", F::NAME);
    assert_eq!(effects(&t, "la").await.len(), 20, "{}", F::NAME);
    fx.teardown().await;
}

/// The broker goes away mid-run and comes back: nothing lost, nothing applied twice.
pub async fn broker_outage_loses_nothing<F: Fixture>() {
    let Some((t, fx)) = begin::<F>("outage").await else { return };
    enqueue(&t, &counted_events(10, 20)).await;
    relay_all(&t, &fx, 200).await;
    let slow = |_: &Counted, _: u32| {
        std::thread::sleep(Duration::from_millis(2));
        false
    };
    let (consumer, applied) = counting_consumer(&t, "ou", fast_config().with_batch_size(20), slow);
    let running = Running::start(consumer, fx.interruptible_transport("ou").await);
    eventually(Duration::from_secs(30), "the first effects", async || !effects(&t, "ou").await.is_empty()).await;
    if fx.interrupt(Duration::from_secs(2)).await.is_none() {
        eprintln!("skipping the outage of {}: the fixture cannot interrupt it", F::NAME);
    }
    eventually(Duration::from_secs(90), "200 effects", async || effects(&t, "ou").await.len() == 200).await;
    running.stop().await;
    let unique: HashSet<_> = effects(&t, "ou").await.into_iter().collect();
    assert_eq!(unique.len(), 200, "{}", F::NAME);
    applied.assert_in_order(F::NAME);
    fx.teardown().await;
}

/// The broker stored an event but its acknowledgement was lost: the relay publishes it again, and the
/// consumer's inbox applies each event once (NATS's msg-id window keeps one copy at the broker; the
/// other brokers keep two, and the inbox absorbs the second).
pub async fn publisher_lost_ack_is_absorbed<F: Fixture>() {
    let Some((t, fx)) = begin::<F>("pub_lost_ack").await else { return };
    enqueue(&t, &counted_events(4, 5)).await;
    let publisher = outbox_seaorm::testkit::FaultyPublisher::new(fx.publisher());
    publisher.lose_acks(5);
    relay_until_published(&t, publisher, 20).await;
    let stored = fx.message_count().await;
    assert!((20..=25).contains(&stored), "{}: {stored} messages for 20 events, 5 acks lost", F::NAME);
    let (consumer, applied) = counting_consumer(&t, "pl", fast_config(), |_, _| false);
    let running = Running::start(consumer, fx.transport("pl").await);
    // At least once: a rebalance (Kafka) or a redelivery may hand a message over again, so the count of
    // handled messages can pass the count stored; the inbox absorbs every extra one.
    let deadline = Instant::now() + Duration::from_secs(90);
    while running.stats().processed + running.stats().duplicates < stored {
        let stats = running.stats();
        assert!(Instant::now() < deadline, "{}: {stored} stored, after 90 s handled: {stats:?}", F::NAME);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = running.stop().await;
    assert_eq!(stats.processed, 20, "{}: each event applied once: {stats:?}", F::NAME);
    assert!(stats.duplicates >= stored - 20, "{}: every second copy absorbed: {stats:?}", F::NAME);
    assert_eq!(effects(&t, "pl").await.len(), 20, "{}: each effect once", F::NAME);
    applied.assert_in_order(F::NAME);
    fx.teardown().await;
}

/// What the broker can never take (a destination it refuses, a message over its size bound) is a dead
/// row with a clear error at once, and the rest of the batch is published.
pub async fn publisher_refuses_bad_input_as_dead_rows<F: Fixture>() {
    let Some((t, fx)) = begin::<F>("pub_refused").await else { return };
    let (publisher, refused) = fx.refusing_publisher().await;
    let fine = Counted { item: "it0".into(), n: 0 }.to_new_event().expect("event");
    let mut events: Vec<NewEvent> = refused.iter().map(|r| r.event.clone()).collect();
    events.push(fine.clone());
    enqueue(&t, &events).await;
    let relay = relay(&t, publisher);
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{}: a refused event is no relay error: {e}", F::NAME));
    let dead = refused.len() as u64;
    assert_eq!((pass.claimed, pass.published, pass.dead), (dead + 1, 1, dead), "{}: {pass:?}", F::NAME);
    for Refused { event, error } in &refused {
        let row = crate::outbox_row(&t, event.id()).await;
        assert!(row.dead_at_ms.is_some() && row.attempts == 1, "{}: {} is dead at once", F::NAME, row.aggregate_id);
        let last_error = row.last_error.unwrap_or_default();
        assert!(last_error.contains(error), "{}: last_error {last_error:?} lacks {error:?}", F::NAME);
    }
    assert!(crate::outbox_row(&t, fine.id()).await.published_at_ms.is_some(), "{}: the valid event", F::NAME);
    assert_eq!(fx.message_count().await, 1, "{}: only the valid event reached the broker", F::NAME);
    fx.teardown().await;
}

/// A URL that cannot work is a configuration error before anything connects, a broker that does not
/// answer is a broker error, and neither shows a password.
pub async fn publisher_refuses_bad_urls<F: Fixture>() {
    let Some((_, fx)) = begin::<F>("pub_bad_url").await else { return };
    let mut secret_seen = false;
    for (url, fragment) in F::BAD_URLS {
        let error = F::connect_publisher(url).await.expect_err(url);
        assert!(matches!(error, outbox_seaorm::Error::InvalidConfig { .. }), "{}: {url}: {error}", F::NAME);
        let text = error.to_string();
        assert!(text.contains(fragment), "{}: {url}: {text:?} lacks {fragment:?}", F::NAME);
        assert!(!text.contains("secret"), "{}: {url}: the password shows: {text}", F::NAME);
        secret_seen |= url.contains("secret");
    }
    assert!(secret_seen, "{}: one bad URL carries a password", F::NAME);
    if let Some(url) = F::UNREACHABLE_URL {
        let error = F::connect_publisher(url).await.expect_err(url);
        assert!(matches!(error, outbox_seaorm::Error::Broker { .. }), "{}: {url}: {error}", F::NAME);
        assert!(!error.to_string().contains("secret"), "{}: the password shows: {error}", F::NAME);
    }
    fx.teardown().await;
}

/// The broker goes away while the relay publishes: the failed publishes leave their rows pending (none
/// marked published, none dead), the publisher reconnects when the broker is back, the backlog drains,
/// and every event is applied once, in order.
pub async fn publisher_outage_loses_nothing<F: Fixture>() {
    let Some((t, fx)) = begin::<F>("pub_outage").await else { return };
    let events = counted_events(10, 10);
    enqueue(&t, &events[..10]).await;
    let relay = relay(&t, fx.interruptible_publisher().await);
    let first = relay.run_once().await.unwrap_or_else(|e| panic!("{}: first pass: {e}", F::NAME));
    assert_eq!(first.published, 10, "{}: {first:?}", F::NAME);
    enqueue(&t, &events[10..]).await;
    let backlog = async || {
        let stats = outbox_ops::admin::stats(&t.db).await.unwrap_or_else(|e| panic!("{t}: stats: {e}"));
        (stats.totals.pending, stats.totals.dead)
    };
    if fx.cut().await {
        let pass =
            relay.run_once().await.unwrap_or_else(|e| panic!("{}: a failed publish is no relay error: {e}", F::NAME));
        assert_eq!((pass.published, pass.dead), (0, 0), "{}: nothing published or killed: {pass:?}", F::NAME);
        assert!(pass.failed > 0, "{}: the outage was seen: {pass:?}", F::NAME);
        assert_eq!(backlog().await, (90, 0), "{}: every row after the cut is still pending", F::NAME);
        fx.restore().await;
    } else {
        eprintln!("skipping the publisher outage of {}: the fixture cannot cut it", F::NAME);
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    while backlog().await != (0, 0) {
        if Instant::now() > deadline {
            let dead = outbox_ops::admin::list_dead(&t.db, &outbox_ops::admin::DeadFilter::all(), 3).await;
            let errors: Vec<_> = dead.into_iter().flatten().map(|row| row.last_error).collect();
            panic!("{}: backlog {:?} 90 s after the outage; dead rows' errors: {errors:?}", F::NAME, backlog().await);
        }
        if let Err(error) = relay.run_once().await {
            eprintln!("{}: relay pass after the outage: {error}", F::NAME);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (consumer, applied) = counting_consumer(&t, "po", fast_config(), |_, _| false);
    let running = Running::start(consumer, fx.transport("po").await);
    eventually(Duration::from_secs(60), "100 effects", async || effects(&t, "po").await.len() == 100).await;
    running.stop().await;
    let unique: HashSet<_> = effects(&t, "po").await.into_iter().collect();
    assert_eq!(unique.len(), 100, "{}: each effect once", F::NAME);
    applied.assert_in_order(F::NAME);
    fx.teardown().await;
}

fn outbox_sample() -> outbox_seaorm::OutboxEvent {
    let event = Counted { item: "it0".into(), n: 9 }.to_new_event().expect("event");
    outbox_seaorm::testkit::outbox_event(&event, 1, 1)
}

/// The transport's lag counts what the consumer has not acknowledged: every relayed event before it reads
/// them, and (the running consumer's own reading, [`Consumer::lag`]) none once it applied them.
pub async fn lag_counts_what_the_consumer_has_not_acknowledged<F: Fixture>() {
    if let Some(why) = F::LAG_UNRELIABLE {
        eprintln!("skipping on {}: {why}", F::NAME);
        return;
    }
    let Some((t, fx)) = begin::<F>("lag").await else { return };
    // Shared, as an app shares it between its consumer and its dashboard: an `Arc` is a transport too.
    let transport = Arc::new(fx.transport("lg").await);
    enqueue(&t, &counted_events(2, 3)).await;
    relay_all(&t, &fx, 6).await;
    let mut seen = None;
    eventually(Duration::from_secs(30), "the lag counts the 6 relayed events", async || {
        seen = transport.lag().await.unwrap_or_else(|e| panic!("{}: lag: {e}", F::NAME));
        seen.is_some_and(|lag| lag.total() == 6)
    })
    .await;
    let lag = seen.expect("a reading");
    assert_eq!(lag.unacked.unwrap_or(0), 0, "{}: nothing delivered yet: {lag:?}", F::NAME);

    let config = fast_config().with_lag_interval(Duration::from_secs(1));
    let (consumer, _) = counting_consumer(&t, "lg", config, |_, _| false);
    let running = Running::start(consumer, Arc::clone(&transport));
    eventually(Duration::from_secs(30), "6 effects", async || effects(&t, "lg").await.len() == 6).await;
    eventually(Duration::from_secs(60), "the consumer reads a lag of 0", async || {
        running.lag().is_some_and(|lag| lag.total() == 0)
    })
    .await;
    running.stop().await;
    fx.teardown().await;
}
