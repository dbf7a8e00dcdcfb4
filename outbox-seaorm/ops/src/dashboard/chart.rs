//! Published events per second over the last 15 minutes, hour or day, counted from the published times in
//! the table: the history is there on the first view, whichever process published and whether or not a page
//! was open. Drawn as an SVG on the server.

use std::collections::BTreeMap;
use std::fmt::Write;

/// How far back the chart looks, and how wide its bars are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Span {
    /// 15 minutes in bars of 15 s.
    #[default]
    Quarter,
    /// An hour in bars of a minute.
    Hour,
    /// A day in bars of 15 minutes.
    Day,
}

impl Span {
    pub const ALL: [Span; 3] = [Span::Quarter, Span::Hour, Span::Day];

    /// The span a `span=` query parameter names; 15 minutes for anything else.
    pub fn parse(text: Option<&str>) -> Span {
        Span::ALL.into_iter().find(|span| Some(span.param()) == text).unwrap_or_default()
    }

    /// Its place in [`Span::ALL`] (and in the dashboard's histories, kept in that order).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its `span=` value.
    pub fn param(self) -> &'static str {
        match self {
            Span::Quarter => "15m",
            Span::Hour => "1h",
            Span::Day => "24h",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Span::Quarter => "last 15 minutes",
            Span::Hour => "last hour",
            Span::Day => "last 24 hours",
        }
    }

    fn bucket_ms(self) -> i64 {
        match self {
            Span::Quarter => 15_000,
            Span::Hour => 60_000,
            Span::Day => 15 * 60_000,
        }
    }

    fn buckets(self) -> i64 {
        match self {
            Span::Quarter => 60,
            Span::Hour => 60,
            Span::Day => 96,
        }
    }

    /// The start of the bucket `ms` falls in.
    fn bucket_of(self, ms: i64) -> i64 {
        ms.div_euclid(self.bucket_ms()) * self.bucket_ms()
    }

    /// The start of the first bucket shown at `now_ms` (the last one holds `now_ms`).
    fn first_bucket(self, now_ms: i64) -> i64 {
        self.bucket_of(now_ms) - (self.buckets() - 1) * self.bucket_ms()
    }
}

/// How long after its published time a row may still be counted in: a relay stamps the time before its
/// mark commits, so the buckets of the last minute are read again.
const SETTLE_MS: i64 = 60_000;

/// The published counts of one span, kept between reads so that a refresh reads only the buckets that may
/// still change.
#[derive(Debug)]
pub(super) struct History {
    span: Span,
    /// Bucket start (epoch ms) → rows published in it.
    counts: BTreeMap<i64, u64>,
    /// Buckets before this one are final; `None` before the first read.
    settled_before_ms: Option<i64>,
    pub read_at_ms: i64,
}

impl History {
    pub fn new(span: Span) -> Self {
        History { span, counts: BTreeMap::new(), settled_before_ms: None, read_at_ms: 0 }
    }

    /// Where the next read starts (a bucket start) and the bucket width: the whole span the first time,
    /// then the buckets that may still change.
    pub fn next_read(&self, now_ms: i64) -> (i64, i64) {
        let first = self.span.first_bucket(now_ms);
        let from = match self.settled_before_ms {
            None => first,
            Some(settled) => Ord::max(first, Ord::min(settled, self.span.bucket_of(now_ms - SETTLE_MS))),
        };
        (from, self.span.bucket_ms())
    }

    /// Takes the counts of a read that started at `from_ms` (bucket start → rows), replacing what was kept
    /// from there on and forgetting the buckets that left the span.
    pub fn merge(&mut self, from_ms: i64, counts: impl IntoIterator<Item = (i64, u64)>, now_ms: i64) {
        let first = self.span.first_bucket(now_ms);
        self.counts.retain(|start, _| *start >= first && *start < from_ms);
        self.counts.extend(counts.into_iter().filter(|(start, _)| *start >= first));
        self.settled_before_ms = Some(self.span.bucket_of(now_ms - SETTLE_MS));
        self.read_at_ms = now_ms;
    }

    /// One bar per bucket of the span at `now_ms`, oldest first, empty buckets included.
    pub fn bars(&self, now_ms: i64) -> Vec<Bar> {
        let (span, first) = (self.span, self.span.first_bucket(now_ms));
        (0..span.buckets())
            .map(|i| {
                let start_ms = first + i * span.bucket_ms();
                let count = self.counts.get(&start_ms).copied().unwrap_or(0);
                // The current bucket is still filling: its rate is over the part that has passed.
                let elapsed = Ord::min(span.bucket_ms(), Ord::max(now_ms - start_ms, 1000));
                Bar { start_ms, count, per_second: count as f64 * 1000.0 / elapsed as f64 }
            })
            .collect()
    }
}

/// One bucket of a chart.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Bar {
    pub start_ms: i64,
    pub count: u64,
    pub per_second: f64,
}

/// The rate of the last complete bucket of `bars` (the one before the bucket still filling).
pub(super) fn last_rate(bars: &[Bar]) -> Option<f64> {
    bars.iter().rev().nth(1).map(|bar| bar.per_second)
}

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 90.0;

/// The bars as SVG markup (numbers only: nothing from the database is written in it). The total and each
/// bar's count are in `data-` attributes, for tests and scripts.
pub(super) fn svg(bars: &[Bar], span: Span) -> String {
    let peak = bars.iter().map(|b| b.per_second).fold(0.0, f64::max);
    let total: u64 = bars.iter().map(|b| b.count).sum();
    let scale = if peak > 0.0 { (HEIGHT - 14.0) / peak } else { 0.0 };
    let mut out = format!(
        r#"<svg id="published-chart" data-span="{}" data-published="{total}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="events published per second, {}">"#,
        span.param(),
        span.label()
    );
    let _ = write!(out, r#"<line x1="0" y1="{HEIGHT}" x2="{WIDTH}" y2="{HEIGHT}" class="axis"/>"#);
    let bar = WIDTH / bars.len().max(1) as f64;
    for (i, b) in bars.iter().enumerate() {
        let h = (b.per_second * scale).max(if b.count > 0 { 1.0 } else { 0.0 });
        let time = chrono::DateTime::from_timestamp_millis(b.start_ms).map(|t| t.format("%H:%M:%S UTC").to_string());
        let _ = write!(
            out,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" data-count="{}"><title>{} from {}: {}/s</title></rect>"#,
            i as f64 * bar,
            HEIGHT - h,
            (bar - 1.0).max(1.0),
            b.count,
            b.count,
            time.unwrap_or_default(),
            rate(b.per_second)
        );
    }
    let _ = write!(
        out,
        r#"<text x="4" y="11">peak {}/s, {total} published</text><text x="{}" y="11" text-anchor="end">now</text></svg>"#,
        rate(peak),
        WIDTH - 4.0
    );
    out
}

/// A rate with the decimals that make a slow one visible: `120`, `8.5`, `0.02`.
pub(super) fn rate(per_second: f64) -> String {
    match per_second {
        r if r >= 100.0 => format!("{r:.0}"),
        r if r >= 1.0 || r == 0.0 => format!("{r:.1}"),
        r => format!("{r:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn the_first_read_counts_the_whole_span_and_later_ones_only_what_may_still_change() {
        let mut history = History::new(Span::Hour);
        let (from, width) = history.next_read(NOW);
        assert_eq!((from, width), (Span::Hour.first_bucket(NOW), 60_000));
        history.merge(from, [(from, 5), (Span::Hour.bucket_of(NOW), 2)], NOW);
        let later = NOW + 10_000;
        let (again, _) = history.next_read(later);
        assert_eq!(again, Span::Hour.bucket_of(later - SETTLE_MS), "only the last minute or so");
        history.merge(again, [(Span::Hour.bucket_of(later), 7)], later);
        let bars = history.bars(later);
        assert_eq!(bars.len(), 60);
        assert_eq!(bars.iter().map(|b| b.count).sum::<u64>(), 5 + 7, "the settled bucket kept, the rest re-read");
    }

    #[test]
    fn buckets_that_leave_the_span_are_forgotten() {
        let mut history = History::new(Span::Quarter);
        let (from, _) = history.next_read(NOW);
        history.merge(from, [(from, 3)], NOW);
        let much_later = NOW + 20 * 60_000;
        let (from, _) = history.next_read(much_later);
        assert_eq!(from, Span::Quarter.first_bucket(much_later), "everything kept is too old: read the span");
        history.merge(from, [], much_later);
        assert_eq!(history.bars(much_later).iter().map(|b| b.count).sum::<u64>(), 0);
    }

    #[test]
    fn the_chart_draws_one_bar_per_bucket_and_says_the_peak_and_total() {
        let mut history = History::new(Span::Quarter);
        let (from, _) = history.next_read(NOW);
        history.merge(from, [(from, 30), (from + 15_000, 150)], NOW);
        let svg = svg(&history.bars(NOW), Span::Quarter);
        assert_eq!(svg.matches("<rect").count(), 60);
        assert!(svg.contains("peak 10.0/s, 180 published") && svg.contains(r#"data-published="180""#), "{svg}");
    }

    #[test]
    fn a_span_is_read_from_its_parameter() {
        assert!(Span::ALL.iter().enumerate().all(|(i, span)| span.index() == i));
        assert_eq!(Span::parse(Some("24h")), Span::Day);
        assert_eq!(Span::parse(Some("1h")), Span::Hour);
        assert_eq!(Span::parse(Some("<script>")), Span::Quarter);
        assert_eq!(Span::parse(None), Span::Quarter);
    }
}
