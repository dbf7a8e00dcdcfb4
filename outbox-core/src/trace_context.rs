//! W3C trace context in event headers: captured where an event is written, restored where it is consumed,
//! so one trace runs from the request that committed the event to the handler that applied it.
//!
//! With the crate's `opentelemetry` feature, [`current`] reads the OpenTelemetry context of the current
//! `tracing` span (through `tracing-opentelemetry`, so the app's subscriber needs its
//! `OpenTelemetryLayer`) and renders it as the [`TRACEPARENT`] and [`TRACESTATE`] headers.
//! `outbox_seaorm::enqueue` and `emit!` add them to every event that does not carry a `traceparent`
//! already (an app that sets its own keeps it). The headers travel with the row and then as broker
//! headers; the consume driver makes the remote span they name the parent of its `outbox.consume.process`
//! span. Without the feature [`current`] returns `None` and nothing is added.
//!
//! The W3C format is written and read here directly (version `00`), whatever text-map propagator the app
//! installed globally, because the header names say W3C.

use crate::envelope::{Headers, NewEvent};

/// The W3C `traceparent` header: `00-<trace id>-<parent span id>-<flags>`.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C `tracestate` header: vendor entries that travel with the trace.
pub const TRACESTATE: &str = "tracestate";

/// The current span's trace context as headers: `traceparent`, and `tracestate` when it is not empty.
/// `None` without the `opentelemetry` feature, or when the current span carries no valid OpenTelemetry
/// context (no `OpenTelemetryLayer`, or outside any span).
pub fn current() -> Option<Vec<(&'static str, String)>> {
    #[cfg(feature = "opentelemetry")]
    {
        use opentelemetry::trace::TraceContextExt as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let context = tracing::Span::current().context();
        let span = context.span();
        let span_context = span.span_context();
        if !span_context.is_valid() {
            return None;
        }
        let mut headers = vec![(
            TRACEPARENT,
            format!(
                "00-{}-{}-{:02x}",
                span_context.trace_id(),
                span_context.span_id(),
                span_context.trace_flags().to_u8()
            ),
        )];
        let state = span_context.trace_state().header();
        if !state.is_empty() {
            headers.push((TRACESTATE, state));
        }
        Some(headers)
    }
    #[cfg(not(feature = "opentelemetry"))]
    None
}

/// Adds `trace` (from [`current`]) to `headers` unless they carry a `traceparent` already; `true` when it
/// added them.
pub fn add_to(headers: &mut Headers, trace: &[(&'static str, String)]) -> bool {
    if headers.contains_key(TRACEPARENT) || trace.is_empty() {
        return false;
    }
    for (name, value) in trace {
        headers.insert((*name).to_owned(), value.clone());
    }
    true
}

/// `event` with the current span's trace context in its headers, unless it has a `traceparent` already
/// or there is no context to capture (see [`current`]).
pub fn with_current(mut event: NewEvent) -> NewEvent {
    if let Some(trace) = current() {
        add_to(event.headers_mut(), &trace);
    }
    event
}

/// The OpenTelemetry context a `traceparent` (and `tracestate`) names, as a remote parent; `None` when the
/// header is missing or malformed (a malformed one is ignored, as W3C asks).
#[cfg(feature = "opentelemetry")]
pub fn extract(headers: &std::collections::BTreeMap<String, String>) -> Option<opentelemetry::Context> {
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState};
    let parent = headers.get(TRACEPARENT)?.trim();
    let mut parts = parent.split('-');
    let (version, trace_id, span_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    // Version 00 has exactly four fields; a later version may append more, which we ignore.
    if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !hex(version, 2) || !hex(trace_id, 32) || !hex(span_id, 16) || !hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let state = headers.get(TRACESTATE).and_then(|s| s.parse::<TraceState>().ok()).unwrap_or_default();
    let span_context = SpanContext::new(trace_id, span_id, TraceFlags::new(flags & 1), true, state);
    span_context.is_valid().then(|| opentelemetry::Context::new().with_remote_span_context(span_context))
}

/// Makes the remote span named by `headers` the parent of `span`. A message without a valid `traceparent`
/// starts a trace of its own, linked to the span `span` was created in (the consumer's): otherwise every
/// untraced message would join the consumer's one long trace. A no-op without an `OpenTelemetryLayer`.
#[cfg(feature = "opentelemetry")]
pub(crate) fn set_parent(span: &tracing::Span, headers: &std::collections::BTreeMap<String, String>) {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let parent = extract(headers).unwrap_or_else(|| {
        let enclosing = tracing::Span::current().context().span().span_context().clone();
        if enclosing.is_valid() {
            span.add_link(enclosing);
        }
        opentelemetry::Context::new()
    });
    if let Err(error) = span.set_parent(parent) {
        tracing::trace!(%error, "trace context not restored");
    }
}

/// Links `span` to the trace context of every event in `events` that carries one (a batch send has many
/// creation contexts, so they are links rather than a parent).
#[cfg(feature = "opentelemetry")]
pub(crate) fn link_events(span: &tracing::Span, events: &[crate::OutboxEvent]) {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    if span.is_disabled() {
        return;
    }
    for event in events {
        if let Some(context) = extract(&event.headers) {
            span.add_link(context.span().span_context().clone());
        }
    }
}

#[cfg(all(test, feature = "opentelemetry"))]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt as _;

    fn headers(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn the_w3c_example_traceparent_is_restored_as_a_remote_sampled_parent() {
        let context = extract(&headers(&[
            (TRACEPARENT, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            (TRACESTATE, "congo=t61rcWkgMzE"),
        ]))
        .expect("a valid traceparent");
        let span = context.span();
        let parent = span.span_context();
        assert_eq!(parent.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parent.span_id().to_string(), "00f067aa0ba902b7");
        assert!(parent.is_sampled() && parent.is_remote());
        assert_eq!(parent.trace_state().get("congo"), Some("t61rcWkgMzE"));
    }

    #[test]
    fn malformed_or_all_zero_traceparents_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(extract(&headers(&[(TRACEPARENT, bad)])).is_none(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn an_app_set_traceparent_is_kept() {
        let mut map = Headers::new();
        map.insert(TRACEPARENT.to_owned(), "mine".to_owned());
        assert!(!add_to(&mut map, &[(TRACEPARENT, "captured".to_owned())]));
        assert_eq!(map[TRACEPARENT], "mine");
    }
}
