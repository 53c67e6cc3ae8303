//! Drawing: a pure function of the state onto a ratatui frame. Nothing here reads data
//! or changes the state. Narrow terminals drop columns and cut text with `…`.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Table};

use crate::input::BINDINGS;

mod panels;
pub mod ranks;
use crate::state::State;
use neuron_datastore::sample::HISTORY;
use neuron_datastore::sample::model::{CpuShare, DeviceMemory, ERROR_CLASSES, HostMemory};

/// Colours, or none (`NO_COLOR`, `--no-color`): then only bold, dim and reverse.
#[derive(Debug, Clone, Copy)]
pub struct Theme {
    pub color: bool,
}

impl Theme {
    fn fg(&self, color: Color) -> Style {
        if self.color { Style::default().fg(color) } else { Style::default() }
    }

    fn title(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    pub(crate) fn label(&self) -> Style {
        self.fg(Color::Blue).add_modifier(Modifier::BOLD)
    }

    fn dim(&self) -> Style {
        Style::default().add_modifier(Modifier::DIM)
    }

    fn selected(&self) -> Style {
        Style::default().add_modifier(Modifier::REVERSED | Modifier::BOLD)
    }

    /// A bar's colour by how full it is.
    fn level(&self, percent: f64) -> Style {
        self.fg(if percent >= 80.0 {
            Color::Red
        } else if percent >= 50.0 {
            Color::Yellow
        } else {
            Color::Green
        })
    }

    fn bad(&self, bad: bool) -> Style {
        if bad { self.fg(Color::Red).add_modifier(Modifier::BOLD) } else { Style::default() }
    }
}

const NA: &str = "N/A";
/// Rows the memory tree keeps before a tall terminal's graphs and process table show.
const TREE_ROWS_WHEN_TALL: u16 = 8;
/// Columns the graphs need to be worth drawing.
const WIDE_MIN_WIDTH: u16 = 100;

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, state: &State, theme: Theme) {
    let area = frame.area();
    if state.ranks_tab {
        let [title, tabs, body, footer] =
            Layout::vertical([Constraint::Length(1), Constraint::Length(1), Constraint::Min(1), Constraint::Length(1)])
                .areas(area);
        draw_title(frame, title, state, theme);
        draw_tabs(frame, tabs, state, theme);
        ranks::draw(frame, body, state, theme);
        draw_footer(frame, footer, state, theme);
        if state.show_help {
            draw_help(frame, area, theme);
        }
        return;
    }
    let runtimes = state.runtimes();
    let devices = shown_devices(state);
    let cores: usize = runtimes.iter().map(|r| r.cores.len()).sum();
    let fixed = 1 + 1 + (devices.len().max(1) as u16 + 2) + 5 + 1;
    let core_rows = (cores as u16 + 1).min(area.height.saturating_sub(fixed + 4) / 2).max(2);
    // A tall terminal also gets history graphs and the process table, as long as the
    // memory tree keeps room for what it shows now.
    let models: usize = runtimes.iter().map(|r| r.models.len()).sum();
    let process_rows = ((runtimes.len() + models) as u16 + 3).min(14);
    let tall = area.height >= fixed + core_rows + panels::GRAPH_ROWS + process_rows + TREE_ROWS_WHEN_TALL
        && area.width >= WIDE_MIN_WIDTH;
    // The graphs take the rows the tree does not use.
    let tree_lines = state.tree();
    let tree_rows = (tree_lines.len() as u16 + 1).max(TREE_ROWS_WHEN_TALL);
    let spare = area.height.saturating_sub(fixed + core_rows + process_rows + tree_rows);
    let (graph_rows, process_rows) = if tall { (spare.max(panels::GRAPH_ROWS), process_rows) } else { (0, 0) };
    let [title, tabs, grid, core_table, summary, graphs, processes, tree, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Length(devices.len().max(1) as u16 + 2),
        Constraint::Length(core_rows),
        Constraint::Length(5),
        Constraint::Length(graph_rows),
        Constraint::Length(process_rows),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(area);
    draw_title(frame, title, state, theme);
    draw_tabs(frame, tabs, state, theme);
    draw_grid(frame, grid, state, &devices, theme);
    draw_cores(frame, core_table, state, theme);
    draw_summary(frame, summary, state, theme);
    if tall {
        panels::draw_graphs(frame, graphs, state, theme);
        panels::draw_processes(frame, processes, state, theme);
    }
    draw_tree(frame, tree, &tree_lines, state, theme);
    draw_footer(frame, footer, state, theme);
    if state.show_help {
        draw_help(frame, area, theme);
    }
}

fn draw_title(frame: &mut Frame, area: Rect, state: &State, theme: Theme) {
    let s = &state.snapshot;
    let i = &s.instance;
    let text = format!(
        "neuron-top {} │ {} │ {}×{} NeuronCore {} │ {} runtime{} │ {}",
        env!("CARGO_PKG_VERSION"),
        i.instance_type,
        i.device_count,
        i.cores_per_device,
        i.core_version,
        s.runtimes.len(),
        plural(s.runtimes.len()),
        s.time,
    );
    frame.render_widget(Paragraph::new(Span::styled(fit(&text, area.width), theme.title())), area);
}

fn draw_tabs(frame: &mut Frame, area: Rect, state: &State, theme: Theme) {
    let selected = state.tab();
    let tabs: Vec<(String, bool)> = std::iter::once(("all".to_string(), false))
        .chain(state.snapshot.runtimes.iter().map(|r| (r.tag.clone(), r.exited)))
        .chain((!state.snapshot.ranks.is_empty()).then(|| ("ranks".to_string(), false)))
        .enumerate()
        .map(|(i, (name, exited))| (format!("[{}]:{name}", i + 1), exited))
        .collect();
    let width = |t: &(String, bool)| t.0.chars().count() + 1;
    // Tabs scroll so that the selected one stays in view, `…` marking those left out.
    let room = (area.width as usize).saturating_sub(2);
    let mut first = 0;
    while first < selected && tabs[first..=selected].iter().map(width).sum::<usize>() > room {
        first += 1;
    }
    let mut spans = Vec::new();
    if first > 0 {
        spans.push(Span::raw("… "));
    }
    let mut used = if first > 0 { 2 } else { 0 };
    for (i, tab) in tabs.iter().enumerate().skip(first) {
        used += width(tab);
        if used > room + 1 {
            spans.push(Span::raw("…"));
            break;
        }
        let mut style = if i == selected { theme.selected() } else { Style::default() };
        if tab.1 {
            style = style.add_modifier(Modifier::DIM);
        }
        spans.push(Span::styled(tab.0.clone(), style));
        spans.push(Span::raw(" "));
    }
    frame.render_widget(Paragraph::new(fit_line(Line::from(spans), area.width)), area);
}

/// The devices holding a core of a shown runtime.
fn shown_devices(state: &State) -> Vec<u32> {
    let mut devices: Vec<u32> = state.runtimes().iter().flat_map(|r| r.cores.iter().map(|c| c.device)).collect();
    devices.sort_unstable();
    devices.dedup();
    devices
}

fn draw_grid(frame: &mut Frame, area: Rect, state: &State, devices: &[u32], theme: Theme) {
    let runtimes = state.runtimes();
    let cores: Vec<_> = runtimes.iter().flat_map(|r| r.cores.iter().map(move |c| (*r, c))).collect();
    let measured: Vec<f64> = cores.iter().filter(|(r, _)| !r.exited).filter_map(|(_, c)| c.utilization).collect();
    let average = if measured.is_empty() {
        NA.to_string()
    } else {
        format!("{:.2}%", measured.iter().sum::<f64>() / measured.len() as f64)
    };
    let mut title = format!(" NeuronCore {} Utilization (Avg: {average}) ", state.snapshot.instance.core_version);
    if state.flops {
        title.push_str("· bars: FLOP/s of PE's defined peak ");
    }
    let idle = (state.snapshot.instance.device_count as usize).saturating_sub(devices.len());
    if state.selected.is_none() && idle > 0 && !devices.is_empty() {
        title.push_str(&format!("· {idle} more device{} idle ", plural(idle)));
    }
    let block = Block::default().borders(Borders::ALL).title(Span::styled(fit(&title, area.width), theme.label()));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if devices.is_empty() {
        let text = if state.snapshot.runtimes.is_empty() {
            "no Neuron runtime is running"
        } else {
            "this runtime holds no NeuronCore"
        };
        frame.render_widget(Paragraph::new(Span::styled(fit(text, inner.width), theme.dim())), inner);
        return;
    }
    let per_device = state.snapshot.instance.cores_per_device.max(1);
    for (row, &device) in devices.iter().enumerate() {
        if row as u16 >= inner.height {
            break;
        }
        let line = Rect { y: inner.y + row as u16, height: 1, ..inner };
        let mut spans = vec![Span::styled(format!("ND{device:<2} "), theme.label())];
        let bar_width = (line.width.saturating_sub(5) / per_device as u16) as usize;
        for k in 0..per_device {
            let index = device * per_device + k;
            // A live runtime's core before an exited one's that held it.
            let held = cores.iter().filter(|(_, c)| c.index == index).min_by_key(|(r, _)| r.exited);
            let (value, percent, dim) = match held {
                // With `f`, the bar is the core's FLOP/s against PE's defined peak.
                Some((runtime, core)) if state.flops => {
                    let of_peak =
                        core.flops_per_second.zip(runtime.peak_flops_per_core).map(|(f, peak)| 100.0 * f / peak);
                    (core.flops_per_second.map(tflops), of_peak, runtime.exited)
                }
                Some((runtime, core)) => {
                    (core.utilization.map(|u| format!("{u:.2}%")), core.utilization, runtime.exited)
                }
                None => (Some("idle".to_string()), None, true),
            };
            spans.extend(bar(&format!("nc{index}"), value.as_deref(), percent, bar_width, dim, theme));
        }
        frame.render_widget(Paragraph::new(Line::from(spans)), line);
    }
}

/// `nc0 [||||||     45.20%] ` in `width` columns: the bar is as long as `percent`.
fn bar<'a>(
    name: &str,
    value: Option<&str>,
    percent: Option<f64>,
    width: usize,
    dim: bool,
    theme: Theme,
) -> Vec<Span<'a>> {
    let value = value.unwrap_or(NA);
    let inner = width.saturating_sub(name.len() + 4);
    if inner < value.len() {
        return vec![Span::styled(fit(&format!("{name} {value} "), width as u16), theme.dim())];
    }
    let filled = percent.map_or(0, |p| ((p / 100.0).clamp(0.0, 1.0) * inner as f64).round() as usize);
    let mut cells: Vec<char> =
        std::iter::repeat_n('|', filled).chain(std::iter::repeat_n(' ', inner - filled)).collect();
    for (slot, c) in cells.iter_mut().rev().zip(value.chars().rev()) {
        *slot = c;
    }
    let text: String = cells.into_iter().collect();
    let style = if dim { theme.dim() } else { theme.level(percent.unwrap_or(0.0)) };
    vec![Span::raw(format!("{name} [")), Span::styled(text, style), Span::raw("] ")]
}

fn draw_cores(frame: &mut Frame, area: Rect, state: &State, theme: Theme) {
    let runtimes = state.runtimes();
    // Columns in the order they are dropped when the terminal is narrow: last first.
    let mut all: [(&str, u16); 7] = [
        ("core", 5),
        ("runtime", 12),
        ("exec/s", 9),
        ("p50", 9),
        ("p99", 9),
        ("TFLOPS", 8),
        ("utilisation history", 20),
    ];
    let mut shown = all.len();
    while shown > 2 && all[..shown].iter().map(|(_, w)| w + 1).sum::<u16>() > area.width {
        shown -= 1;
    }
    // The history takes what is left, up to all it holds.
    if shown == all.len() {
        let others: u16 = all[..shown - 1].iter().map(|(_, w)| w + 1).sum();
        all[shown - 1].1 = area.width.saturating_sub(others).min(HISTORY as u16 + 1);
    }
    let columns = &all[..shown];
    let header = Row::new(columns.iter().map(|(name, _)| Cell::from(*name))).style(theme.label());
    let cores: Vec<_> = runtimes.iter().flat_map(|r| r.cores.iter().map(move |c| (*r, c))).collect();
    // When they do not all fit, the last line says how many are left out.
    let room = area.height.saturating_sub(1) as usize;
    let shown_cores = if cores.len() > room { room.saturating_sub(1) } else { cores.len() };
    let hidden = cores.len() - shown_cores;
    let rows = cores[..shown_cores].iter().map(|&(runtime, core)| {
        // The newest samples that fit.
        let fits = columns.get(6).map_or(0, |(_, w)| w.saturating_sub(1) as usize);
        let history: String =
            core.history.iter().skip(core.history.len().saturating_sub(fits)).map(|&u| spark(u)).collect();
        let cells = [
            format!("nc{}", core.index),
            runtime.tag.clone(),
            core.executions_per_second.map_or(NA.into(), |r| format!("{r:.1}")),
            core.latency_p50.map_or(NA.into(), seconds),
            core.latency_p99.map_or(NA.into(), seconds),
            core.flops_per_second.map_or(NA.into(), |f| format!("{:.4}", f / 1e12)),
            history,
        ];
        let row = Row::new(cells.into_iter().zip(columns).map(|(text, (_, w))| Cell::from(fit_tail(&text, *w))));
        if runtime.exited { row.style(theme.dim()) } else { row }
    });
    let widths = columns.iter().map(|(_, w)| Constraint::Length(*w));
    let more =
        (hidden > 0).then(|| Row::new([Cell::from("…"), Cell::from(format!("{hidden} more"))]).style(theme.dim()));
    frame.render_widget(Table::new(rows.chain(more), widths).header(header), area);
}

/// One history cell: a block whose height is the utilisation.
fn spark(percent: f64) -> char {
    const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    LEVELS[((percent.clamp(0.0, 100.0) / 100.0) * 7.0).round() as usize]
}

fn draw_summary(frame: &mut Frame, area: Rect, state: &State, theme: Theme) {
    let runtimes = state.runtimes();
    let share =
        |s: Option<CpuShare>| s.map_or(NA.to_string(), |s| format!("[user {:.1}%, system {:.1}%]", s.user, s.system));
    let runtime_cpu = runtimes.iter().filter_map(|r| r.vcpu).fold(None, |sum: Option<CpuShare>, s| {
        let sum = sum.unwrap_or_default();
        Some(CpuShare { user: sum.user + s.user, system: sum.system + s.system })
    });
    let system = &state.snapshot.system;
    let host_use = match (system.memory_used_bytes, system.memory_total_bytes) {
        (Some(used), Some(total)) => format!("{} of {}", bytes(used), bytes(total)),
        _ => NA.to_string(),
    };
    let mut host = HostMemory::default();
    let mut device = DeviceMemory::default();
    let mut errors = [0u64; 6];
    let (mut events, mut dropped) = (None::<f64>, 0u64);
    for r in &runtimes {
        host.add(&r.host_memory);
        r.cores.iter().for_each(|c| device.add(&c.device_memory));
        for (total, n) in errors.iter_mut().zip(r.errors) {
            *total += n;
        }
        if let Some(rate) = r.trace_events_per_second {
            events = Some(events.unwrap_or(0.0) + rate);
        }
        dropped += r.trace_events_dropped;
    }
    let label = |text: &str| Span::styled(format!("{text:<8}"), theme.label());
    let lines = vec![
        Line::from(vec![
            label("vCPU"),
            Span::raw(format!("system {}  runtime {}", share(system.vcpu), share(runtime_cpu))),
        ]),
        Line::from(vec![
            label("Host"),
            Span::raw(format!(
                "{} used │ runtime allocations {}: tensors {}, constants {}, DMA {}, app {}",
                host_use,
                bytes(host.total()),
                bytes(host.tensors),
                bytes(host.constants),
                bytes(host.dma_buffers),
                bytes(host.application_memory)
            )),
        ]),
        Line::from(vec![
            label("Device"),
            Span::raw(format!(
                "{}: tensors {}, constants {}, code {}, runtime {}, scratchpad {}",
                bytes(device.total()),
                bytes(device.tensors),
                bytes(device.constants),
                bytes(device.model_code),
                bytes(device.runtime_memory),
                bytes(device.model_shared_scratchpad)
            )),
        ]),
        Line::from(
            std::iter::once(label("Errors"))
                .chain(
                    ERROR_CLASSES
                        .iter()
                        .zip(errors)
                        .map(|(name, n)| Span::styled(format!("{name} {n}  "), theme.bad(n > 0))),
                )
                .collect::<Vec<_>>(),
        ),
        Line::from(vec![
            label("Trace"),
            Span::raw(format!("{} events/s, ", events.map_or(NA.to_string(), si))),
            Span::styled(format!("{dropped} dropped"), theme.bad(dropped > 0)),
            Span::raw(" (lost to every reader)"),
        ]),
    ];
    let lines: Vec<Line> = lines.into_iter().map(|l| fit_line(l, area.width)).collect();
    frame.render_widget(Paragraph::new(lines), area);
}

fn draw_tree(frame: &mut Frame, area: Rect, rows: &[crate::state::TreeRow], state: &State, theme: Theme) {
    let numbers: u16 = if area.width >= 70 { 10 + 15 + 13 } else { 15 };
    let name_width = area.width.saturating_sub(numbers + 3).max(8);
    let mut header = vec![Cell::from("Device / core / model")];
    let mut widths = vec![Constraint::Length(name_width)];
    if area.width >= 70 {
        header.push(Cell::from("Model ID"));
        widths.push(Constraint::Length(10));
    }
    header.push(Cell::from("Device Memory"));
    widths.push(Constraint::Length(15));
    if area.width >= 70 {
        header.push(Cell::from("Host Memory"));
        widths.push(Constraint::Length(13));
    }
    // Keep the cursor in view.
    let visible = area.height.saturating_sub(1) as usize;
    let first = state.cursor.saturating_sub(visible.saturating_sub(1));
    let body = rows.iter().enumerate().skip(first).take(visible).map(|(i, row)| {
        let marker = match row.node {
            Some(_) if row.expanded => "▾ ",
            Some(_) => "▸ ",
            None => "  ",
        };
        let name = format!("{}{marker}{}", "  ".repeat(row.depth as usize), row.label);
        let mut cells = vec![Cell::from(fit(&name, name_width))];
        if area.width >= 70 {
            cells.push(Cell::from(row.model_id.map_or(String::new(), |id| id.to_string())));
        }
        cells.push(Cell::from(row.device_bytes.map_or(String::new(), bytes)));
        if area.width >= 70 {
            cells.push(Cell::from(row.host_bytes.map_or(String::new(), bytes)));
        }
        let r = Row::new(cells);
        if i == state.cursor { r.style(theme.selected()) } else { r }
    });
    frame.render_widget(Table::new(body, widths).header(Row::new(header).style(theme.label())), area);
}

/// The keys, or what could not be read.
fn draw_footer(frame: &mut Frame, area: Rect, state: &State, theme: Theme) {
    let line = match state.snapshot.warnings.first() {
        Some(warning) => {
            let more = state.snapshot.warnings.len() - 1;
            let text = if more > 0 { format!("{warning} (and {more} more)") } else { warning.clone() };
            Span::styled(fit(&format!("⚠ {text}"), area.width), theme.bad(true))
        }
        None => Span::styled(
            fit("q quit  ? help  Tab/a/d tabs  r ranks  ↑↓ move  enter expand  x all  f FLOP/s", area.width),
            theme.dim(),
        ),
    };
    frame.render_widget(Paragraph::new(line), area);
}

fn draw_help(frame: &mut Frame, area: Rect, theme: Theme) {
    // As wide as the longest line needs, so that no line is cut from 80 columns on.
    let label_width = BINDINGS.iter().map(|b| b.label.chars().count()).max().unwrap_or(0) as u16;
    let help_width = BINDINGS.iter().map(|b| b.help.chars().count()).max().unwrap_or(0) as u16;
    let width = area.width.min(label_width + help_width + 3);
    let height = area.height.min(BINDINGS.len() as u16 + 4);
    let popup = Rect { x: area.x + (area.width - width) / 2, y: area.y + (area.height - height) / 2, width, height };
    let block = Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(fit(" Keys (Esc or ? closes) ", width), theme.title()));
    let rows =
        BINDINGS.iter().map(|b| Row::new([Cell::from(Span::styled(b.label, theme.label())), Cell::from(b.help)]));
    frame.render_widget(Clear, popup);
    frame.render_widget(Table::new(rows, [Constraint::Length(label_width), Constraint::Min(10)]).block(block), popup);
}

/// `text` in at most `width` columns, cut with `…` when longer.
pub(crate) fn fit(text: &str, width: u16) -> String {
    let width = width as usize;
    if text.chars().count() <= width {
        return text.to_string();
    }
    if width == 0 {
        return String::new();
    }
    text.chars().take(width - 1).chain(['…']).collect()
}

/// Like `fit`, leaving a column free after the text (table cells).
pub(crate) fn fit_tail(text: &str, width: u16) -> String {
    fit(text, width.saturating_sub(1))
}

/// A line cut to `width` columns with `…`.
pub(crate) fn fit_line(line: Line<'_>, width: u16) -> Line<'_> {
    let mut left = width as usize;
    let total: usize = line.spans.iter().map(|s| s.content.chars().count()).sum();
    if total <= left {
        return line;
    }
    let mut spans = Vec::new();
    for span in line.spans {
        let n = span.content.chars().count();
        if n < left {
            left -= n;
            spans.push(span);
        } else {
            let text: String = span.content.chars().take(left.saturating_sub(1)).chain(['…']).collect();
            spans.push(Span::styled(text, span.style));
            break;
        }
    }
    Line::from(spans)
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Bytes in binary units: `749 B`, `4.3 MiB`.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Seconds as `850 µs`, `27.0 ms`, `1.20 s`.
pub(crate) fn seconds(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.0} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

fn tflops(flops: f64) -> String {
    format!("{:.4} TFLOPS", flops / 1e12)
}

/// A rate with an SI prefix: `950`, `5.2k`, `1.3M`.
fn si(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.1}M", value / 1e6)
    } else if value >= 1e3 {
        format!("{:.1}k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}

/// A runtime's command line as the process table shows it: after `[stopped]` or
/// `[stale]` while its process is there but its heartbeat is old, and `[exited]` in its
/// last frames (dimmed too, which plain text cannot show).
pub(crate) fn command_with_state(runtime: &neuron_datastore::sample::model::Runtime) -> String {
    match runtime.state {
        "stopped" | "stale" | "exited" => format!("[{}] {}", runtime.state, runtime.command),
        _ => runtime.command.clone(),
    }
}
