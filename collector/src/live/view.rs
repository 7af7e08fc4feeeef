//! The live view's screen: what it remembers of the samples ([`Model`]) and how it draws them
//! with ratatui ([`draw`]).
//!
//! Layout, top to bottom: a title line (process, interval, uptime, stacks named, the
//! collector's CPU per refresh); the totals (live bytes and blocks, their change since start and over the last
//! interval); a two-line sparkline of total live bytes over time, scaled from the lowest to the
//! highest value it shows; the sites table; a status line (keys, or what went wrong, or that
//! the target exited). Columns are dropped on narrow terminals, least useful first (blocks,
//! then Δ last interval, then Δ since start), so that the site keeps at least
//! [`MIN_SITE`] columns.

use super::sampler::{Live, Sample};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Samples of total live bytes kept for the sparkline (one per refresh; the screen shows the
/// most recent that fit its width).
const HISTORY: usize = 1024;

/// Narrowest site column kept before numeric columns are dropped.
pub const MIN_SITE: u16 = 24;

/// What the table is sorted by (largest first; ties by live bytes, then by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    /// Live bytes now.
    Live,
    /// Change of live bytes since the first sample.
    SinceStart,
    /// Change of live bytes since the previous sample.
    LastInterval,
    /// Live blocks now.
    Blocks,
}

impl SortKey {
    const ALL: [SortKey; 4] = [
        SortKey::Live,
        SortKey::SinceStart,
        SortKey::LastInterval,
        SortKey::Blocks,
    ];

    /// The next key (Tab cycles through them).
    pub fn next(self) -> SortKey {
        let i = SortKey::ALL.iter().position(|&k| k == self).unwrap_or(0);
        SortKey::ALL[(i + 1) % SortKey::ALL.len()]
    }
}

/// One row of the sites table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteRow {
    /// Allocation site.
    pub site: Arc<str>,
    /// Live bytes and blocks now (zero for a site whose blocks are all gone).
    pub live: Live,
    /// Change of live bytes since the first sample (bytes).
    pub since_start: i64,
    /// Change of live bytes since the previous sample (bytes).
    pub last_interval: i64,
}

/// Everything the screen shows, updated by each sample.
#[derive(Debug)]
pub struct Model {
    /// "1234 (server)": the process.
    pub target: String,
    /// The refresh interval.
    pub every: Duration,
    started: Instant,
    first: Option<Sample>,
    prev: Option<Sample>,
    cur: Option<Sample>,
    history: VecDeque<u64>,
    /// Refreshes received.
    pub refreshes: u64,
    /// The table's order.
    pub sort: SortKey,
    /// Rows scrolled past.
    pub offset: usize,
    /// The last refresh's error, until a refresh succeeds.
    pub error: Option<String>,
    /// Set once the target is gone: the screen then stays as it is until `q`.
    pub exited: Option<String>,
}

impl Model {
    /// An empty model: no sample yet.
    pub fn new(target: String, every: Duration) -> Model {
        Model {
            target,
            every,
            started: Instant::now(),
            first: None,
            prev: None,
            cur: None,
            history: VecDeque::new(),
            refreshes: 0,
            sort: SortKey::Live,
            offset: 0,
            error: None,
            exited: None,
        }
    }

    /// Takes a new sample: it becomes the current one, the current one the previous one.
    pub fn push(&mut self, s: Sample) {
        if self.first.is_none() {
            self.first = Some(s.clone());
        }
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(s.total.bytes);
        self.prev = self.cur.replace(s);
        self.refreshes += 1;
        self.error = None;
    }

    /// The current sample, once there is one.
    pub fn current(&self) -> Option<&Sample> {
        self.cur.as_ref()
    }

    /// Change of total live bytes (since start, over the last interval).
    pub fn total_deltas(&self) -> (i64, i64) {
        let Some(cur) = &self.cur else { return (0, 0) };
        let d = |o: &Option<Sample>| {
            o.as_ref()
                .map_or(0, |o| diff(cur.total.bytes, o.total.bytes))
        };
        (d(&self.first), d(&self.prev))
    }

    /// The sites table in the chosen order: every site live now, plus those live at start or
    /// at the previous sample whose blocks are all gone since (their change is the news).
    pub fn rows(&self) -> Vec<SiteRow> {
        let Some(cur) = &self.cur else {
            return Vec::new();
        };
        let empty = HashMap::new();
        let first = self.first.as_ref().map_or(&empty, |s| &s.sites);
        let prev = self.prev.as_ref().map_or(first, |s| &s.sites);
        let mut names: Vec<&Arc<str>> = cur.sites.keys().collect();
        names.extend(first.keys().filter(|k| !cur.sites.contains_key(*k)));
        names.extend(
            prev.keys()
                .filter(|k| !cur.sites.contains_key(*k) && !first.contains_key(*k)),
        );
        let bytes = |m: &HashMap<Arc<str>, Live>, k: &Arc<str>| m.get(k).map_or(0, |l| l.bytes);
        let mut rows: Vec<SiteRow> = names
            .into_iter()
            .map(|k| {
                let live = cur.sites.get(k).copied().unwrap_or_default();
                SiteRow {
                    site: k.clone(),
                    live,
                    since_start: diff(live.bytes, bytes(first, k)),
                    last_interval: diff(live.bytes, bytes(prev, k)),
                }
            })
            .collect();
        let key = |r: &SiteRow| -> i128 {
            match self.sort {
                SortKey::Live => r.live.bytes as i128,
                SortKey::SinceStart => r.since_start as i128,
                SortKey::LastInterval => r.last_interval as i128,
                SortKey::Blocks => r.live.blocks as i128,
            }
        };
        rows.sort_by(|a, b| {
            key(b)
                .cmp(&key(a))
                .then(b.live.bytes.cmp(&a.live.bytes))
                .then(a.site.cmp(&b.site))
        });
        rows
    }

    /// The sparkline's values, oldest first.
    pub fn history(&self) -> impl Iterator<Item = u64> + '_ {
        self.history.iter().copied()
    }

    /// Time since the view started.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
}

/// `a - b` as a signed number of bytes (saturating).
fn diff(a: u64, b: u64) -> i64 {
    (a as i128 - b as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// Bytes in binary units: `512 B`, `1.5 KiB`, `12.3 MiB`, `1.0 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if v >= 999.95 && u < UNITS.len() - 1 {
        // 1023.97 KiB would print as "1024.0 KiB".
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// A change of bytes with its sign: `+1.5 KiB`, `-512 B`, `0`.
pub fn signed_bytes(n: i64) -> String {
    match n.signum() {
        0 => "0".to_owned(),
        1 => format!("+{}", bytes(n.unsigned_abs())),
        _ => format!("-{}", bytes(n.unsigned_abs())),
    }
}

/// A count with thousands separators: `20,050`.
pub fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `HH:MM:SS`.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// `text` cut to `width` characters, ending in `…` when cut.
fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    if width == 0 {
        return String::new();
    }
    let mut s: String = text.chars().take(width - 1).collect();
    s.push('…');
    s
}

/// A numeric column of the sites table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    /// Live bytes.
    Live,
    /// Δ since start.
    SinceStart,
    /// Δ last interval.
    LastInterval,
    /// Live blocks.
    Blocks,
}

impl Column {
    fn title(self) -> &'static str {
        match self {
            Column::Live => "LIVE",
            Column::SinceStart => "Δ START",
            Column::LastInterval => "Δ LAST",
            Column::Blocks => "BLOCKS",
        }
    }
    fn width(self) -> u16 {
        match self {
            Column::Blocks => 9,
            _ => 11,
        }
    }
    fn sorts(self) -> SortKey {
        match self {
            Column::Live => SortKey::Live,
            Column::SinceStart => SortKey::SinceStart,
            Column::LastInterval => SortKey::LastInterval,
            Column::Blocks => SortKey::Blocks,
        }
    }
    fn cell(self, r: &SiteRow) -> String {
        match self {
            Column::Live => bytes(r.live.bytes),
            Column::SinceStart => signed_bytes(r.since_start),
            Column::LastInterval => signed_bytes(r.last_interval),
            Column::Blocks => count(r.live.blocks),
        }
    }
}

/// The numeric columns that fit `width` terminal columns with a site column of at least
/// [`MIN_SITE`]: all four when they fit; else without blocks, then without Δ last interval,
/// then without Δ since start; live bytes always.
pub fn columns(width: u16) -> Vec<Column> {
    let mut cols = vec![
        Column::Live,
        Column::SinceStart,
        Column::LastInterval,
        Column::Blocks,
    ];
    let need = |c: &[Column]| c.iter().map(|c| c.width() + 1).sum::<u16>() + MIN_SITE;
    for drop in [Column::Blocks, Column::LastInterval, Column::SinceStart] {
        if need(&cols) <= width {
            break;
        }
        cols.retain(|&c| c != drop);
    }
    cols
}

/// Draws the whole screen.
pub fn draw(f: &mut Frame<'_>, m: &Model) {
    let area = f.area();
    let [title, totals, spark, table, status] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Length(2),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(area);
    let w = area.width as usize;
    let bold = Style::new().add_modifier(Modifier::BOLD);
    // Title.
    let mut t = format!(
        "pid {} · every {} · {}",
        m.target,
        humantime::format_duration(m.every),
        clock(m.uptime())
    );
    if let Some(s) = m.current() {
        t.push_str(&format!(
            " · {} stacks · cpu {:.1} ms/refresh",
            count(s.known_stacks as u64),
            s.cpu.as_secs_f64() * 1e3
        ));
    }
    f.render_widget(Paragraph::new(fit(&t, w)).style(bold), title);
    // Totals.
    let line = match m.current() {
        None => "taking the first snapshot…".to_owned(),
        Some(s) => {
            let (d0, d1) = m.total_deltas();
            format!(
                "live {} in {} blocks · since start {} · last interval {}",
                bytes(s.total.bytes),
                count(s.total.blocks),
                signed_bytes(d0),
                signed_bytes(d1)
            )
        }
    };
    f.render_widget(Paragraph::new(fit(&line, w)), totals);
    draw_sparkline(f, m, spark);
    draw_table(f, m, table);
    // Status: what went wrong, or that the target exited, else the keys.
    let (text, style) = if let Some(why) = &m.exited {
        (
            format!("{why}: last screen kept · q to quit"),
            Style::new().add_modifier(Modifier::REVERSED),
        )
    } else if let Some(e) = &m.error {
        (
            format!("refresh failed: {e}"),
            Style::new().add_modifier(Modifier::REVERSED),
        )
    } else if let Some(warn) = m.current().and_then(|s| s.warnings.first()) {
        (format!("warning: {warn}"), Style::new())
    } else {
        (
            "sort: l live · s Δ start · i Δ last · b blocks · ↑↓ scroll · q quit".to_owned(),
            Style::new(),
        )
    };
    f.render_widget(Paragraph::new(fit(&text, w)).style(style), status);
}

fn draw_sparkline(f: &mut Frame<'_>, m: &Model, area: Rect) {
    // The most recent values that fit, with the range printed on the left.
    let hist: Vec<u64> = m.history().collect();
    if hist.is_empty() || area.width < 20 {
        return;
    }
    let label_w = 12u16;
    let [label, bars] =
        Layout::horizontal([Constraint::Length(label_w), Constraint::Min(1)]).areas(area);
    let n = (bars.width as usize).min(hist.len());
    let shown = &hist[hist.len() - n..];
    let (lo, hi) = (
        *shown.iter().min().unwrap_or(&0),
        *shown.iter().max().unwrap_or(&0),
    );
    // In exact bytes when the units would print the same number twice.
    let (top, bottom) = match (bytes(hi), bytes(lo)) {
        (h, l) if h == l && hi != lo => (count(hi), count(lo)),
        hl => hl,
    };
    f.render_widget(
        Paragraph::new(vec![Line::from(top), Line::from(bottom)]),
        label,
    );
    // Scaled from the lowest value shown: a leak of a few KiB in a heap of many MiB shows.
    // The lowest value gets a bar of its own height 1 of 16, so that the line is never blank.
    let span = hi - lo;
    let data: Vec<u64> = shown
        .iter()
        .map(|&v| {
            (u128::from(v - lo) * 15)
                .checked_div(u128::from(span))
                .map_or(1, |h| h as u64 + 1)
        })
        .collect();
    f.render_widget(Sparkline::default().data(&data).max(16), bars);
}

fn draw_table(f: &mut Frame<'_>, m: &Model, area: Rect) {
    let cols = columns(area.width);
    let site_w = area
        .width
        .saturating_sub(cols.iter().map(|c| c.width() + 1).sum::<u16>())
        .max(1);
    let bold = Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
    let mut header: Vec<Cell<'_>> = cols
        .iter()
        .map(|c| {
            let text = Line::from(c.title()).right_aligned();
            if c.sorts() == m.sort {
                Cell::from(text).style(bold)
            } else {
                Cell::from(text)
            }
        })
        .collect();
    header.push(Cell::from("SITE"));
    let rows = m.rows();
    let visible = area.height.saturating_sub(1) as usize;
    let offset = m.offset.min(rows.len().saturating_sub(visible.max(1)));
    let body: Vec<Row<'_>> = rows
        .iter()
        .skip(offset)
        .take(visible)
        .map(|r| {
            let mut cells: Vec<Cell<'_>> = cols
                .iter()
                .map(|c| Cell::from(Line::from(c.cell(r)).right_aligned()))
                .collect();
            cells.push(Cell::from(Span::raw(fit(&r.site, site_w as usize))));
            Row::new(cells)
        })
        .collect();
    let mut widths: Vec<Constraint> = cols.iter().map(|c| Constraint::Length(c.width())).collect();
    widths.push(Constraint::Min(1));
    let table = Table::new(body, widths)
        .header(Row::new(header).style(Style::new().add_modifier(Modifier::REVERSED)))
        .column_spacing(1);
    f.render_widget(table, area);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(total: u64, sites: &[(&str, u64, u64)]) -> Sample {
        Sample {
            total: Live {
                bytes: total,
                blocks: sites.iter().map(|s| s.2).sum(),
            },
            sites: sites
                .iter()
                .map(|&(n, b, k)| {
                    (
                        Arc::from(n),
                        Live {
                            bytes: b,
                            blocks: k,
                        },
                    )
                })
                .collect(),
            ..Sample::default()
        }
    }

    #[test]
    fn deltas_and_sort_orders() {
        let mut m = Model::new("pid 1".into(), Duration::from_secs(1));
        m.push(sample(
            1100,
            &[("cache", 1000, 10), ("leak", 100, 1), ("gone", 0, 0)],
        ));
        m.push(sample(1300, &[("cache", 1000, 10), ("leak", 300, 3)]));
        m.push(sample(
            1700,
            &[("cache", 1000, 10), ("leak", 600, 6), ("burst", 100, 50)],
        ));
        assert_eq!(m.total_deltas(), (600, 400));
        let rows = m.rows();
        let names: Vec<&str> = rows.iter().map(|r| &*r.site).collect();
        assert_eq!(names, ["cache", "leak", "burst", "gone"]);
        let leak = &rows[1];
        assert_eq!((leak.since_start, leak.last_interval), (500, 300));
        assert_eq!(
            leak.live,
            Live {
                bytes: 600,
                blocks: 6
            }
        );
        m.sort = SortKey::SinceStart;
        assert_eq!(&*m.rows()[0].site, "leak");
        m.sort = SortKey::LastInterval;
        let names: Vec<String> = m.rows().iter().map(|r| r.site.to_string()).collect();
        assert_eq!(names, ["leak", "burst", "cache", "gone"]);
        m.sort = SortKey::Blocks;
        assert_eq!(&*m.rows()[0].site, "burst");
        assert_eq!(SortKey::Blocks.next(), SortKey::Live);
    }

    #[test]
    fn a_site_whose_blocks_are_gone_shows_its_loss() {
        let mut m = Model::new("pid 1".into(), Duration::from_secs(1));
        m.push(sample(300, &[("a", 200, 2), ("b", 100, 1)]));
        m.push(sample(200, &[("a", 200, 2)]));
        let rows = m.rows();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (
                rows[1].site.as_ref(),
                rows[1].live.bytes,
                rows[1].since_start,
                rows[1].last_interval
            ),
            ("b", 0, -100, -100)
        );
    }

    #[test]
    fn formats() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(1024 * 1024 - 1), "1.0 MiB");
        assert_eq!(bytes(5 << 30), "5.0 GiB");
        assert_eq!(signed_bytes(-512), "-512 B");
        assert_eq!(signed_bytes(2048), "+2.0 KiB");
        assert_eq!(signed_bytes(0), "0");
        assert_eq!(signed_bytes(i64::MIN), "-8192.0 PiB");
        assert_eq!(count(20050), "20,050");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000_000), "1,000,000");
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 4), "abc");
        assert_eq!(clock(Duration::from_secs(3725)), "01:02:05");
    }

    #[test]
    fn narrow_terminals_drop_columns_least_useful_first() {
        use Column::*;
        assert_eq!(columns(120), [Live, SinceStart, LastInterval, Blocks]);
        assert_eq!(columns(80), [Live, SinceStart, LastInterval, Blocks]);
        // 11 + 1 columns for each Δ and live bytes, 9 + 1 for blocks, 24 for the site.
        assert_eq!(columns(70), [Live, SinceStart, LastInterval, Blocks]);
        assert_eq!(columns(69), [Live, SinceStart, LastInterval]);
        assert_eq!(columns(60), [Live, SinceStart, LastInterval]);
        assert_eq!(columns(59), [Live, SinceStart]);
        assert_eq!(columns(48), [Live, SinceStart]);
        assert_eq!(columns(47), [Live]);
        assert_eq!(columns(10), [Live]);
    }

    #[test]
    fn draws_on_a_plain_80_by_24_screen() {
        use ratatui::backend::TestBackend;
        let mut t = ratatui::Terminal::new(TestBackend::new(80, 24)).unwrap();
        let mut m = Model::new("42 (leaky)".into(), Duration::from_secs(1));
        m.push(sample(
            3 << 20,
            &[("fill_cache", 2 << 20, 20000), ("leak_more", 1 << 20, 8192)],
        ));
        m.push(sample(
            5 << 20,
            &[
                ("fill_cache", 2 << 20, 20000),
                ("leak_more", 3 << 20, 16384),
            ],
        ));
        m.exited = Some("pid 42 has exited".into());
        t.draw(|f| draw(f, &m)).unwrap();
        let buf = t.backend().buffer().clone();
        let lines: Vec<String> = (0..24)
            .map(|y| (0..80).map(|x| buf[(x, y)].symbol().to_owned()).collect())
            .collect();
        assert!(
            lines[0].starts_with(
                "pid 42 (leaky) · every 1s · 00:00:00 · 0 stacks · cpu 0.0 ms/refresh"
            ),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].starts_with("live 5.0 MiB in 36,384 blocks · since start +2.0 MiB"),
            "{}",
            lines[1]
        );
        assert!(
            lines[4].contains("LIVE") && lines[4].contains("BLOCKS") && lines[4].contains("SITE")
        );
        assert!(
            lines[5].contains("3.0 MiB")
                && lines[5].contains("+2.0 MiB")
                && lines[5].contains("16,384")
                && lines[5].contains("leak_more"),
            "{}",
            lines[5]
        );
        assert!(lines[6].contains("fill_cache"));
        assert!(lines[23].starts_with("pid 42 has exited: last screen kept · q to quit"));
    }
}
