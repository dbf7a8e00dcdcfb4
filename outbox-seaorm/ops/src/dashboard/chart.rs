//! Published events per second over the last 15 minutes: sampled from the database (so every relay
//! process counts, not only this one) and drawn as an SVG on the server.

use std::collections::VecDeque;
use std::fmt::Write;
use std::time::Duration;

/// How far back the chart looks.
pub(super) const WINDOW: Duration = Duration::from_secs(15 * 60);

/// One sample: events published per second over the interval ending at `at_ms`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Sample {
    pub at_ms: i64,
    pub per_second: f64,
}

/// The samples of the last [`WINDOW`], oldest first.
#[derive(Debug, Default)]
pub(super) struct Series {
    samples: VecDeque<Sample>,
}

impl Series {
    pub fn push(&mut self, sample: Sample) {
        let horizon = sample.at_ms - WINDOW.as_millis() as i64;
        while self.samples.front().is_some_and(|s| s.at_ms <= horizon) {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.samples.iter().copied().collect()
    }
}

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 90.0;

/// The bars of `samples` ending at `now_ms`, as SVG markup (numbers only: nothing from the database is
/// written in it).
pub(super) fn svg(samples: &[Sample], now_ms: i64) -> String {
    let window_ms = WINDOW.as_millis() as f64;
    let peak = samples.iter().map(|s| s.per_second).fold(0.0, f64::max);
    let scale = if peak > 0.0 { (HEIGHT - 14.0) / peak } else { 0.0 };
    let mut out = format!(
        r#"<svg id="published-chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="events published per second, last 15 minutes">"#
    );
    let _ = write!(out, r#"<line x1="0" y1="{HEIGHT}" x2="{WIDTH}" y2="{HEIGHT}" class="axis"/>"#);
    let bar = (WIDTH / (samples.len().max(60) as f64)).max(2.0);
    for sample in samples {
        let age = (now_ms - sample.at_ms).max(0) as f64;
        let x = WIDTH - (age / window_ms) * WIDTH - bar;
        if x < 0.0 {
            continue;
        }
        let h = (sample.per_second * scale).max(if sample.per_second > 0.0 { 1.0 } else { 0.0 });
        let _ = write!(
            out,
            r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}"><title>{:.1}/s</title></rect>"#,
            HEIGHT - h,
            (bar - 1.0).max(1.0),
            sample.per_second
        );
    }
    let _ = write!(
        out,
        r#"<text x="4" y="11">peak {peak:.1}/s</text><text x="{}" y="11" text-anchor="end">now</text></svg>"#,
        WIDTH - 4.0
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_keeps_fifteen_minutes() {
        let mut series = Series::default();
        for minute in 0..20 {
            series.push(Sample { at_ms: minute * 60_000, per_second: minute as f64 });
        }
        let kept = series.samples();
        assert_eq!(kept.first().map(|s| s.at_ms), Some(5 * 60_000));
        assert_eq!(kept.len(), 15);
    }

    #[test]
    fn the_chart_draws_one_bar_per_sample_and_says_the_peak() {
        let samples = [Sample { at_ms: 10_000, per_second: 2.0 }, Sample { at_ms: 20_000, per_second: 8.5 }];
        let svg = svg(&samples, 20_000);
        assert_eq!(svg.matches("<rect").count(), 2);
        assert!(svg.contains("peak 8.5/s"), "{svg}");
    }
}
