//! Figures over rounds (median, min, max, ratio against a baseline) as markdown tables, and SVG plots.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::prelude::*;

/// One timed drain or load run.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    /// Events (or transactions) done.
    pub done: u64,
    /// Wall-clock seconds.
    pub secs: f64,
    /// Whether the time budget ran out first.
    pub timed_out: bool,
}

impl Run {
    /// Done per second.
    pub fn rate(&self) -> f64 {
        if self.secs > 0.0 { self.done as f64 / self.secs } else { 0.0 }
    }
}

/// Median, min and max of `values` (empty: zeros).
pub fn summary(values: &[f64]) -> (f64, f64, f64) {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    (median, v[0], v[n - 1])
}

/// The value at quantile `q` (0..=1) of sorted `v`.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

/// A markdown table that prints to stdout and appends to the `--out` file.
pub struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    notes: Vec<String>,
}

impl Table {
    /// A table with `title` and column names.
    pub fn new(title: impl Into<String>, header: &[&str]) -> Table {
        Table {
            title: title.into(),
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a row of cells.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Adds a row for throughput `runs` of one `case`/`variant`, with the median of its per-round ratios to
    /// the `baseline` runs (None: this row is the baseline). Rounds alternate variants, so each pair ran
    /// back to back and a slow stretch of the machine cancels out of its ratio.
    pub fn rate_row(&mut self, case: &str, variant: &str, runs: &[Run], baseline: Option<&[Run]>, unit: &str) {
        let rates: Vec<f64> = runs.iter().map(Run::rate).collect();
        let (median, min, max) = summary(&rates);
        let ratio = match baseline {
            None => "baseline".to_owned(),
            Some(base) if base.iter().all(|b| b.rate() > 0.0) && !base.is_empty() => ratio(round_ratio(runs, base)),
            Some(_) => "-".to_owned(),
        };
        let note = runs
            .iter()
            .find(|r| r.timed_out)
            .map(|r| format!("timed out after {:.0} s at {:.0} {unit}", r.secs, r.rate()))
            .unwrap_or_default();
        self.row(vec![case.to_owned(), variant.to_owned(), fmt(median), fmt(min), fmt(max), ratio, note]);
    }

    /// Adds a line under the table.
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// The table as markdown.
    pub fn markdown(&self) -> String {
        let mut s =
            format!("\n### {}\n\n| {} |\n|{}\n", self.title, self.header.join(" | "), "---|".repeat(self.header.len()));
        for row in &self.rows {
            let _ = writeln!(s, "| {} |", row.join(" | "));
        }
        for note in &self.notes {
            let _ = writeln!(s, "\n{note}");
        }
        s
    }

    /// Prints the table and appends it to `out` when given.
    pub fn emit(&self, out: Option<&Path>) -> Result<()> {
        let md = self.markdown();
        println!("{md}");
        if let Some(path) = out {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("open {}", path.display()))?;
            file.write_all(md.as_bytes()).with_context(|| format!("append to {}", path.display()))?;
        }
        Ok(())
    }
}

/// The standard header of throughput tables.
pub const RATE_HEADER: [&str; 7] = ["case", "variant", "median", "min", "max", "vs baseline", "note"];

/// A number for a table: no decimals above 100, two below.
pub fn fmt(x: f64) -> String {
    if x.abs() >= 100.0 { format!("{x:.0}") } else { format!("{x:.2}") }
}

/// One line of a plot: a label and its points.
pub struct Series {
    /// Legend text.
    pub label: String,
    /// (x, y) points, x ascending.
    pub points: Vec<(f64, f64)>,
}

/// Writes `file` under `dir` as an SVG line chart of `series`; `log_x` plots x on a log10 axis.
pub fn plot(
    dir: &Path,
    file: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_x: bool,
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let path = dir.join(file);
    let tx = |x: f64| if log_x { x.max(1e-9).log10() } else { x };
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| tx(p.0)));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let y1 = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(0.0f64, f64::max);
    let (x0, x1) = if x0 < x1 { (x0, x1) } else { (x0 - 1.0, x0 + 1.0) };
    let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
    let draw = || -> std::result::Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(&path, (800, 500)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, 0.0..y1)?;
        let x_fmt = |x: &f64| if log_x { fmt(10f64.powf(*x)) } else { fmt(*x) };
        chart.configure_mesh().x_desc(x_label).y_desc(y_label).x_label_formatter(&x_fmt).draw()?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let points: Vec<(f64, f64)> = s.points.iter().map(|p| (tx(p.0), p.1)).collect();
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?;
    Ok(path)
}

/// A ratio for a table: two decimals, three below 0.1.
pub fn ratio(r: f64) -> String {
    if r < 0.1 { format!("{r:.3}x") } else { format!("{r:.2}x") }
}

/// The median of the per-round ratios `runs[i] / baseline[i]` (each pair ran back to back), rather than the
/// ratio of the medians; rounds beyond the shorter list are left out.
pub fn round_ratio(runs: &[Run], baseline: &[Run]) -> f64 {
    let ratios: Vec<f64> = runs.iter().zip(baseline).map(|(r, b)| r.rate() / b.rate().max(f64::MIN_POSITIVE)).collect();
    summary(&ratios).0
}
