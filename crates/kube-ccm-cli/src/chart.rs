//! Tenure charts: who held which Lease when, drawn as SVG on a time axis (`demo --report`, `leader-migration
//! status --report`). Pure: the callers gather the tenures; this only lays them out.
//!
//! One band per Lease, one row per process that held it, one bar per tenure coloured by the holder's
//! component; hand-off gaps are hatched and labelled; events (a replica joining, stopped, killed) are
//! vertical lines; footer lines carry the verdict. Every bar, gap and mark has a `<title>` or label and a
//! `data-*` description (times as `data-start-us`, `data-end-us`, `data-at-us`: microseconds since the
//! chart's start), so the picture can be checked by its content.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;

/// One continuous hold of a Lease by one process.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub lease: String,
    /// The holder as people know it (a replica's name, or its identity).
    pub holder: String,
    /// The holder's component, when known (`kube-controller-manager`, `cloud-controller-manager`).
    pub component: Option<String>,
    pub start_us: i64,
    /// `None`: still held at the chart's end.
    pub end_us: Option<i64>,
}

/// A change of holder: from the previous holder's last write to the acquisition.
#[derive(Debug, Clone, PartialEq)]
pub struct Gap {
    pub lease: String,
    pub to: String,
    pub at_us: i64,
    pub gap_ms: f64,
    /// The previous holder released the Lease (otherwise it expired).
    pub released: bool,
}

/// Something that happened to the processes at one moment (a replica joined, was stopped or killed).
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    pub at_us: i64,
    pub label: String,
}

/// Whether a footer line is good or bad news.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Good,
    Bad,
    Plain,
}

/// Everything drawn.
#[derive(Debug, Clone, Default)]
pub struct Chart {
    pub title: String,
    /// The time axis: from, to (microseconds since the epoch).
    pub start_us: i64,
    pub end_us: i64,
    /// Leases in the order drawn; a Lease of a bar not listed is drawn after these.
    pub leases: Vec<String>,
    pub bars: Vec<Bar>,
    pub gaps: Vec<Gap>,
    pub marks: Vec<Mark>,
    pub footer: Vec<(Tone, String)>,
    /// Label times by the clock (UTC) instead of seconds since the start: for a chart of a live cluster,
    /// whose start is an arbitrary moment.
    pub clock: bool,
}

const WIDTH: f64 = 1100.0;
const LABEL_WIDTH: f64 = 300.0;
const RIGHT: f64 = 30.0;
const ROW: f64 = 22.0;
const BAND_HEADER: f64 = 24.0;
const TOP: f64 = 96.0;
const LINE: f64 = 18.0;

/// The colour of a component's bars.
fn colour(component: Option<&str>) -> &'static str {
    match component {
        Some(kube_ccm_leadermigration::KUBE_CONTROLLER_MANAGER) => "#3b6fb6",
        Some(kube_ccm_leadermigration::CLOUD_CONTROLLER_MANAGER) => "#e07b24",
        _ => "#888888",
    }
}

/// Text for XML content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 allows no other control characters (an identity comes from an Event's note).
            c if c.is_control() && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// The temporary file a report is written to before it is renamed to `path`.
fn partial(path: &Path) -> anyhow::Result<std::path::PathBuf> {
    let name = path
        .file_name()
        .with_context(|| format!("--report {}: not a file name", path.display()))?;
    Ok(path.with_file_name(format!(".{}.partial", name.to_string_lossy())))
}

/// `text` cut to `max` characters, with an ellipsis when cut (long identities in the row labels).
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max - 1).collect();
    cut.push('…');
    cut
}

/// Seconds since the chart's start, for labels.
fn seconds(chart: &Chart, at_us: i64) -> String {
    if chart.clock {
        return jiff::Timestamp::from_microsecond(at_us).map_or_else(
            |_| at_us.to_string(),
            |t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        );
    }
    format!("{:.2} s", (at_us - chart.start_us) as f64 / 1e6)
}

/// A tick spacing (seconds) giving at most about ten ticks over `span` seconds.
fn tick_step(span: f64) -> f64 {
    let rough = (span / 10.0).max(1e-3);
    let magnitude = 10f64.powf(rough.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|step| *step >= rough)
        .unwrap_or(10.0 * magnitude)
}

/// A gap's label beside it: milliseconds, or seconds from one second on.
fn gap_label(gap_ms: f64) -> String {
    if gap_ms >= 1000.0 {
        format!("{:.1} s", gap_ms / 1000.0)
    } else {
        format!("{gap_ms:.0} ms")
    }
}

/// One Lease's band as placed by [`Chart::layout`]: the y of its header and of each row.
#[derive(Debug, PartialEq)]
struct Band {
    /// The Lease's name.
    lease: String,
    /// The y of the band's header.
    top: f64,
    /// The y of the row that says so, for a Lease nobody held.
    never_held: Option<f64>,
    /// Each holder, in order of first acquisition, with the y of its row.
    rows: Vec<(String, f64)>,
}

/// Where everything sits vertically ([`Chart::layout`]): kept apart from the drawing so that the
/// placement can be checked by numbers rather than by reading SVG.
#[derive(Debug, PartialEq)]
struct Layout {
    /// The bands in drawing order.
    bands: Vec<Band>,
    /// The y of each (Lease, holder) row: where that holder's bars and the gaps before them go.
    rows_at: BTreeMap<(String, String), f64>,
    /// The y of the time axis, the plot's bottom.
    bottom: f64,
    /// The y of the first footer line.
    footer_top: f64,
    /// The whole picture's height.
    height: f64,
}

/// Each band's header and its rows' labels (or "never held"), where [`Chart::layout`] placed them.
fn draw_bands(svg: &mut String, bands: &[Band]) {
    for band in bands {
        let _ = writeln!(
            svg,
            r##"<text x="10" y="{:.1}" font-weight="bold" data-lease="{}">Lease {}</text><line x1="10" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#cccccc"/>"##,
            band.top + 16.0,
            escape(&band.lease),
            escape(&band.lease),
            WIDTH - RIGHT,
            band.top + BAND_HEADER - 2.0,
            band.top + BAND_HEADER - 2.0
        );
        if let Some(y) = band.never_held {
            let _ = writeln!(
                svg,
                r##"<text x="{LABEL_WIDTH}" y="{:.1}" fill="#888888">never held</text>"##,
                y + 15.0
            );
        }
        for (holder, y) in &band.rows {
            let _ = writeln!(
                svg,
                r#"<text x="24" y="{:.1}">{}<title>{}</title></text>"#,
                *y + 15.0,
                escape(&shorten(holder, 40)),
                escape(holder)
            );
        }
    }
}

impl Chart {
    /// The Leases in drawing order, each with its holders in order of first acquisition.
    fn bands(&self) -> Vec<(String, Vec<String>)> {
        let mut order: Vec<String> = self.leases.clone();
        for bar in &self.bars {
            if !order.contains(&bar.lease) {
                order.push(bar.lease.clone());
            }
        }
        let mut holders: BTreeMap<&str, Vec<(i64, String)>> = BTreeMap::new();
        for bar in &self.bars {
            let rows = holders.entry(&bar.lease).or_default();
            match rows.iter_mut().find(|(_, h)| *h == bar.holder) {
                Some((first, _)) => *first = (*first).min(bar.start_us),
                None => rows.push((bar.start_us, bar.holder.clone())),
            }
        }
        order
            .into_iter()
            .map(|lease| {
                let mut rows = holders.remove(lease.as_str()).unwrap_or_default();
                rows.sort();
                (lease, rows.into_iter().map(|(_, h)| h).collect())
            })
            .collect()
    }

    fn x(&self, at_us: i64) -> f64 {
        let end_us = self.end_us.max(self.start_us + 1);
        let span = (end_us - self.start_us) as f64;
        let at = (at_us.clamp(self.start_us, end_us) - self.start_us) as f64;
        LABEL_WIDTH + at / span * (WIDTH - LABEL_WIDTH - RIGHT)
    }

    /// Where the bands, their rows, the time axis and the footer sit: decided from the chart alone, before
    /// anything is drawn, so that drawing only writes what this placed.
    fn layout(&self) -> Layout {
        let bands = self.bands();
        let rows: usize = bands.iter().map(|(_, holders)| holders.len().max(1)).sum();
        let plot_height = bands.len() as f64 * BAND_HEADER + rows as f64 * ROW;
        let footer_top = TOP + plot_height + 40.0;
        let mut layout = Layout {
            bands: Vec::with_capacity(bands.len()),
            rows_at: BTreeMap::new(),
            bottom: TOP + plot_height,
            footer_top,
            height: footer_top + (self.footer.len() as f64 + 1.0) * LINE + 10.0,
        };
        let mut y = TOP;
        for (lease, holders) in bands {
            let top = y;
            y += BAND_HEADER;
            let mut never_held = None;
            if holders.is_empty() {
                never_held = Some(y);
                y += ROW;
            }
            let mut rows = Vec::with_capacity(holders.len());
            for holder in holders {
                layout.rows_at.insert((lease.clone(), holder.clone()), y);
                rows.push((holder, y));
                y += ROW;
            }
            layout.bands.push(Band {
                lease,
                top,
                never_held,
                rows,
            });
        }
        layout
    }

    /// The chart as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let layout = self.layout();
        let mut svg = String::new();
        self.draw_header(&mut svg, layout.height);
        self.legend(&mut svg);
        self.axis(&mut svg, layout.bottom);
        draw_bands(&mut svg, &layout.bands);
        self.draw_tenures(&mut svg, &layout.rows_at);
        self.draw_gaps(&mut svg, &layout.rows_at);
        self.draw_marks(&mut svg, layout.bottom);
        self.draw_footer(&mut svg, layout.footer_top);
        svg.push_str("</svg>\n");
        svg
    }

    /// The document's opening: its size, the gaps' hatching, the white ground and the title.
    fn draw_header(&self, svg: &mut String, height: f64) {
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
        );
        svg.push_str(
            r##"<defs><pattern id="gap" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="3" height="6" fill="#c0392b" opacity="0.5"/></pattern></defs>
<rect width="100%" height="100%" fill="white"/>
"##,
        );
        let _ = writeln!(
            svg,
            r#"<text x="10" y="22" font-size="16" font-weight="bold">{}</text>"#,
            escape(&self.title)
        );
    }

    /// One bar per tenure, on its holder's row.
    fn draw_tenures(&self, svg: &mut String, rows_at: &BTreeMap<(String, String), f64>) {
        for bar in &self.bars {
            let Some(top) = rows_at.get(&(bar.lease.clone(), bar.holder.clone())) else {
                continue;
            };
            let (x1, x2) = (self.x(bar.start_us), self.x(bar.end_us.unwrap_or(self.end_us)));
            let until = bar
                .end_us
                .map_or_else(|| "still held".to_owned(), |end| seconds(self, end));
            let _ = writeln!(
                svg,
                r#"<rect class="tenure" x="{x1:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"{} data-lease="{}" data-holder="{}" data-component="{}" data-start-us="{}" data-end-us="{}"><title>{} held {} from {} to {}</title></rect>"#,
                top + 3.0,
                (x2 - x1).max(1.5),
                ROW - 6.0,
                colour(bar.component.as_deref()),
                if bar.end_us.is_none() {
                    r#" fill-opacity="0.7""#
                } else {
                    ""
                },
                escape(&bar.lease),
                escape(&bar.holder),
                escape(bar.component.as_deref().unwrap_or("unknown")),
                bar.start_us - self.start_us,
                bar.end_us
                    .map_or_else(|| "open".to_owned(), |end| (end - self.start_us).to_string()),
                escape(&bar.holder),
                escape(&bar.lease),
                seconds(self, bar.start_us),
                until
            );
        }
    }

    /// One hatched, labelled gap per hand-off, on the new holder's row, ending at its acquisition.
    fn draw_gaps(&self, svg: &mut String, rows_at: &BTreeMap<(String, String), f64>) {
        for gap in &self.gaps {
            let Some(top) = rows_at.get(&(gap.lease.clone(), gap.to.clone())) else {
                continue;
            };
            let from = gap.at_us - (gap.gap_ms * 1000.0) as i64;
            let (x1, x2) = (self.x(from), self.x(gap.at_us));
            let how = if gap.released { "released" } else { "expired" };
            let _ = writeln!(
                svg,
                r##"<rect class="gap" x="{x1:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="url(#gap)" stroke="#c0392b" stroke-width="0.5" data-lease="{}" data-to="{}" data-gap-ms="{:.1}" data-how="{how}"><title>{} hand-off to {}: {:.1} ms ({how})</title></rect><text x="{:.1}" y="{:.1}" font-size="10" fill="#c0392b">{}</text>"##,
                top + 1.0,
                (x2 - x1).max(1.0),
                ROW - 2.0,
                escape(&gap.lease),
                escape(&gap.to),
                gap.gap_ms,
                escape(&gap.lease),
                escape(&gap.to),
                gap.gap_ms,
                x2 + 2.0,
                top + ROW - 1.0,
                gap_label(gap.gap_ms)
            );
        }
    }

    /// One dashed vertical line per event, down to the axis at `bottom`, its label on one of three
    /// staggered lines above the plot.
    fn draw_marks(&self, svg: &mut String, bottom: f64) {
        for (index, mark) in self.marks.iter().enumerate() {
            let x = self.x(mark.at_us);
            let label_y = 58.0 + (index % 3) as f64 * 12.0;
            // Labels near the right edge run leftwards, so they stay inside the picture.
            let near_right = x > WIDTH - RIGHT - 160.0;
            let anchor = if near_right { "end" } else { "start" };
            let _ = writeln!(
                svg,
                r##"<g class="mark" data-label="{}" data-at-us="{}"><line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}" stroke="#555555" stroke-dasharray="3,3"/><text x="{:.1}" y="{label_y:.1}" font-size="10" fill="#555555" text-anchor="{anchor}">{}</text></g>"##,
                escape(&mark.label),
                mark.at_us - self.start_us,
                label_y + 3.0,
                bottom,
                if near_right { x - 2.0 } else { x + 2.0 },
                escape(&mark.label)
            );
        }
    }

    /// The footer lines from `top`, the first in bold, each in its tone's colour.
    fn draw_footer(&self, svg: &mut String, top: f64) {
        for (index, (tone, line)) in self.footer.iter().enumerate() {
            let fill = match tone {
                Tone::Good => "#1e7e34",
                Tone::Bad => "#c0392b",
                Tone::Plain => "#222222",
            };
            let weight = if index == 0 { "bold" } else { "normal" };
            let _ = writeln!(
                svg,
                r#"<text class="footer" x="10" y="{:.1}" fill="{fill}" font-weight="{weight}">{}</text>"#,
                top + index as f64 * LINE,
                escape(line)
            );
        }
    }

    /// Checks, before any work, that a report can be written to `path`: a file name in an existing directory
    /// where this process may create files (tried with the temporary file [`Chart::write`] uses).
    pub fn check_destination(path: &Path) -> anyhow::Result<()> {
        let directory = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        if !directory.is_dir() {
            anyhow::bail!(
                "--report {}: the directory {} does not exist",
                path.display(),
                directory.display()
            );
        }
        if path.is_dir() {
            anyhow::bail!("--report {}: a directory, not a file", path.display());
        }
        let temporary = partial(path)?;
        std::fs::write(&temporary, b"")
            .and_then(|()| std::fs::remove_file(&temporary))
            .map_err(|error| anyhow::anyhow!("--report {}: cannot write there: {error}", path.display()))
    }

    /// Writes the SVG to `path` whole or not at all (a temporary file beside it, then a rename).
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let temporary = partial(path)?;
        std::fs::write(&temporary, self.to_svg())
            .and_then(|()| std::fs::rename(&temporary, path))
            .map_err(|error| {
                let _ = std::fs::remove_file(&temporary);
                anyhow::anyhow!("--report {}: {error}", path.display())
            })
    }

    fn legend(&self, svg: &mut String) {
        let mut x = 10.0;
        for (component, label) in [
            (
                Some(kube_ccm_leadermigration::KUBE_CONTROLLER_MANAGER),
                "kube-controller-manager",
            ),
            (
                Some(kube_ccm_leadermigration::CLOUD_CONTROLLER_MANAGER),
                "cloud-controller-manager",
            ),
            (None, "other or unknown"),
        ] {
            let _ = writeln!(
                svg,
                r#"<rect x="{x}" y="32" width="12" height="12" fill="{}"/><text x="{}" y="42">{label}</text>"#,
                colour(component),
                x + 16.0
            );
            x += 200.0;
        }
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="32" width="12" height="12" fill="url(#gap)"/><text x="{}" y="42">hand-off gap (last write of the old holder → acquisition)</text>"#,
            x + 16.0
        );
    }

    fn axis(&self, svg: &mut String, bottom: f64) {
        let span = (self.end_us - self.start_us).max(1) as f64 / 1e6;
        let step = tick_step(span);
        let _ = writeln!(
            svg,
            r##"<line x1="{LABEL_WIDTH}" x2="{}" y1="{bottom:.1}" y2="{bottom:.1}" stroke="#222222"/>"##,
            WIDTH - RIGHT
        );
        let mut tick = 0.0;
        while tick <= span + 1e-9 {
            let x = self.x(self.start_us + (tick * 1e6) as i64);
            let _ = writeln!(
                svg,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{:.1}" stroke="#eeeeee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"##,
                bottom + 4.0,
                bottom + 16.0,
                match (self.clock, step < 1.0) {
                    (true, _) => jiff::Timestamp::from_microsecond(self.start_us + (tick * 1e6) as i64)
                        .map_or_else(|_| String::new(), |t| t.strftime("%H:%M:%S").to_string()),
                    (false, true) => format!("{tick:.1} s"),
                    (false, false) => format!("{tick:.0} s"),
                }
            );
            tick += step;
        }
    }
}

#[cfg(test)]
mod tests;
