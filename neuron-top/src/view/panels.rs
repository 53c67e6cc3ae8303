//! What a tall terminal adds below the summary (btop-style): history graphs of every
//! shown core's utilisation, FLOP/s and latency, as wide as the terminal, and the
//! process table with command names, sortable. Drawing only, like `view`.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Borders, Cell, Chart, Dataset, GraphType, Row, Table};

use super::{Theme, bytes, fit_tail, seconds};
use crate::state::{ProcessSort, State};
use neuron_datastore::sample::HISTORY;
use neuron_datastore::sample::model::Core;

/// Rows the history graphs take.
pub(crate) const GRAPH_ROWS: u16 = 12;

/// Core colours, in turn.
const CORE_COLORS: [Color; 6] = [Color::Cyan, Color::Magenta, Color::Yellow, Color::Green, Color::Blue, Color::Red];

/// One graph: a title, each core's values (oldest first; `None` where nothing was
/// measured), the axis maximum, and how a value reads.
struct Graph<'a> {
    title: &'a str,
    series: Vec<(String, Vec<Option<f64>>)>,
    max: f64,
    label: fn(f64) -> String,
}

/// Utilisation, FLOP/s and latency p50 of the shown cores, side by side.
pub(crate) fn draw_graphs(frame: &mut Frame, area: Rect, state: &State, theme: Theme) {
    let cores: Vec<&Core> = state.runtimes().iter().flat_map(|r| r.cores.iter()).collect();
    let series = |values: &dyn Fn(&Core) -> Vec<Option<f64>>| {
        cores.iter().map(|c| (format!("nc{}", c.index), values(c))).collect::<Vec<_>>()
    };
    let utilization = series(&|c| c.history.iter().map(|&u| Some(u)).collect());
    let flops = series(&|c| c.flops_history.iter().map(|&f| Some(f)).collect());
    let latency = series(&|c| c.latency_history.clone());
    let peak = |s: &[(String, Vec<Option<f64>>)]| {
        s.iter().flat_map(|(_, v)| v.iter().flatten()).fold(0.0f64, |m, &v| m.max(v))
    };
    let graphs = [
        Graph { title: "utilisation", series: utilization, max: 100.0, label: |v| format!("{v:.0}%") },
        Graph { max: nice_ceiling(peak(&flops)), title: "FLOP/s", series: flops, label: si_flops },
        Graph { max: nice_ceiling(peak(&latency)), title: "latency p50", series: latency, label: seconds },
    ];
    let areas =
        Layout::horizontal([Constraint::Ratio(1, 3), Constraint::Ratio(1, 3), Constraint::Ratio(1, 3)]).split(area);
    let step = state.refresh.as_secs_f64().max(0.001);
    for (graph, &area) in graphs.iter().zip(areas.iter()) {
        draw_graph(frame, area, graph, step, theme);
    }
}

/// A graph over the last [`HISTORY`] samples, `step` seconds apart: the x axis is
/// time in seconds, fixed, and fills from the right as samples arrive.
fn draw_graph(frame: &mut Frame, area: Rect, graph: &Graph<'_>, step: f64, theme: Theme) {
    let points: Vec<Vec<(f64, f64)>> = graph
        .series
        .iter()
        .map(|(_, values)| {
            // x is the sample's age in seconds: the newest at 0, on the right.
            let n = values.len();
            values
                .iter()
                .enumerate()
                .filter_map(|(i, v)| v.map(|v| ((i as f64 - (n as f64 - 1.0)) * step, v)))
                .collect()
        })
        .collect();
    let datasets: Vec<Dataset<'_>> = graph
        .series
        .iter()
        .zip(&points)
        .enumerate()
        .map(|(k, ((name, _), points))| {
            let style =
                if theme.color { Style::default().fg(CORE_COLORS[k % CORE_COLORS.len()]) } else { Style::default() };
            Dataset::default()
                .name(name.clone())
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(style)
                .data(points)
        })
        .collect();
    let window = HISTORY as f64 * step;
    let now = graph.series.iter().find_map(|(_, v)| v.last().copied().flatten()).map_or("–".into(), graph.label);
    // The title names the cores in their colours: a legend box would hide the newest
    // samples, which are the ones people look at.
    let mut title = vec![Span::styled(format!(" {} · now {now} ", graph.title), theme.label())];
    for (k, (name, _)) in graph.series.iter().enumerate() {
        let style =
            if theme.color { Style::default().fg(CORE_COLORS[k % CORE_COLORS.len()]) } else { Style::default() };
        title.push(Span::styled(format!("{name} "), style));
    }
    let title = Line::from(title);
    let chart = Chart::new(datasets)
        .block(Block::default().borders(Borders::ALL).title(title))
        .legend_position(None)
        .x_axis(Axis::default().bounds([-window, 0.0]).labels([
            Span::raw(format!("−{}", age(window))),
            Span::raw(format!("−{}", age(window / 2.0))),
            Span::raw("now"),
        ]))
        .y_axis(Axis::default().bounds([0.0, graph.max.max(f64::MIN_POSITIVE)]).labels([
            Span::raw("0"),
            Span::raw((graph.label)(graph.max / 2.0)),
            Span::raw((graph.label)(graph.max)),
        ]));
    frame.render_widget(chart, area);
}

/// A time span of the x axis: `119 s`, `12 s`, `1.5 s`, `6 min`.
fn age(seconds: f64) -> String {
    if seconds >= 600.0 {
        format!("{:.0} min", seconds / 60.0)
    } else if seconds >= 10.0 || seconds.fract() < 0.05 {
        format!("{seconds:.0} s")
    } else {
        format!("{seconds:.1} s")
    }
}

/// The process table: one row per shown runtime, sorted by `state.sort`, each followed
/// by a row per model it has loaded.
pub(crate) fn draw_processes(frame: &mut Frame, area: Rect, state: &State, theme: Theme) {
    let runtimes = state.sort.order(state.runtimes());
    let sorted = state.sort;
    // Each memory column says which memory it counts: the process's resident set, and
    // the device memory its cores hold (all categories).
    let columns: [(&str, Option<ProcessSort>, u16); 8] = [
        ("pid", Some(ProcessSort::Pid), 8),
        ("name", Some(ProcessSort::Name), 16),
        ("cores", None, 10),
        ("exec/s", Some(ProcessSort::Executions), 9),
        ("vCPU", Some(ProcessSort::Cpu), 7),
        ("resident", None, 10),
        ("device mem", Some(ProcessSort::Memory), 11),
        ("command", None, 0),
    ];
    let fixed: u16 = columns.iter().map(|(_, _, w)| w + 1).sum();
    let command_width = area.width.saturating_sub(fixed + 2).max(8);
    let header = Row::new(columns.iter().map(|(name, sort, _)| {
        let mark = if *sort == Some(sorted) { "▼" } else { "" };
        Cell::from(format!("{name}{mark}"))
    }))
    .style(theme.label());
    let widths: Vec<u16> = columns.iter().map(|(_, _, w)| if *w == 0 { command_width } else { *w }).collect();
    let cells_row =
        |cells: [String; 8]| Row::new(cells.into_iter().zip(&widths).map(|(text, w)| Cell::from(fit_tail(&text, *w))));
    let rows = runtimes.iter().flat_map(|r| {
        let rates: Vec<f64> = r.cores.iter().filter_map(|c| c.executions_per_second).collect();
        let executions = if rates.is_empty() { "N/A".to_string() } else { format!("{:.1}", rates.iter().sum::<f64>()) };
        let device_memory = r.cores.iter().map(|c| c.device_memory.total()).sum::<u64>();
        let cores: Vec<String> = r.cores.iter().map(|c| format!("nc{}", c.index)).collect();
        let cells = [
            r.pid.to_string(),
            r.tag.clone(),
            cores.join(","),
            executions,
            r.vcpu.map_or("N/A".into(), |c| format!("{:.0}%", c.user + c.system)),
            r.resident_bytes.map_or("N/A".into(), bytes),
            bytes(device_memory),
            super::command_with_state(r),
        ];
        // Its models under it, each with its own rate and latency.
        let models = r.models.iter().map(|m| {
            let latency = match (m.latency_p50, m.latency_p99) {
                (Some(p50), Some(p99)) => format!("p50 {}  p99 {}", seconds(p50), seconds(p99)),
                _ => "no executions in the last interval".into(),
            };
            cells_row([
                String::new(),
                format!("└ {}", m.name),
                format!("nc{}", m.core),
                m.executions_per_second.map_or("N/A".into(), |e| format!("{e:.1}")),
                String::new(),
                String::new(),
                bytes(m.device_memory.total()),
                latency,
            ])
        });
        let dim = Style::default().add_modifier(ratatui::style::Modifier::DIM);
        let row = cells_row(cells);
        std::iter::once(if r.exited { row.style(dim) } else { row }).chain(models.collect::<Vec<_>>())
    });
    let widths = columns.iter().map(|(_, _, w)| Constraint::Length(if *w == 0 { command_width } else { *w }));
    let title = format!(" Processes (s: sort by the next column; now {}) ", sort_name(sorted));
    frame.render_widget(
        Table::new(rows, widths).header(header).block(
            Block::default().borders(Borders::ALL).title(Span::styled(fit_tail(&title, area.width), theme.label())),
        ),
        area,
    );
}

fn sort_name(sort: ProcessSort) -> &'static str {
    match sort {
        ProcessSort::Executions => "exec/s",
        ProcessSort::Cpu => "vCPU",
        ProcessSort::Memory => "device mem",
        ProcessSort::Name => "name",
        ProcessSort::Pid => "pid",
    }
}

/// The smallest 1, 2 or 5 times a power of ten at or above `v` (1 for nothing).
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * power).find(|&c| c >= v * (1.0 - 1e-12)).unwrap_or(10.0 * power)
}

fn si_flops(v: f64) -> String {
    match v {
        v if v >= 1e12 => format!("{:.3}T", v / 1e12),
        v if v >= 1e9 => format!("{}G", trim(v / 1e9)),
        v if v >= 1e6 => format!("{}M", trim(v / 1e6)),
        v if v >= 1e3 => format!("{}k", trim(v / 1e3)),
        v => trim(v),
    }
}

/// A number with no needless decimals: 2, 2.5, 0.25.
fn trim(v: f64) -> String {
    let text = format!("{v:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_maxima_are_one_two_or_five_times_a_power_of_ten() {
        assert_eq!(nice_ceiling(83.5e9), 100e9);
        assert_eq!(nice_ceiling(0.0531), 0.1);
        assert_eq!(nice_ceiling(0.0179), 0.02);
        assert_eq!(nice_ceiling(4.2), 5.0);
        assert_eq!(nice_ceiling(5.0), 5.0);
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(si_flops(50e9), "50G");
        assert_eq!(si_flops(25e9), "25G");
    }
}
