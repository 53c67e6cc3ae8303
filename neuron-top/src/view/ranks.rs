//! The Ranks tab: each communicator the runtimes take part in, from their flight
//! records (`neuron_datastore::ranks`): the diagnosis on top (a hang, the straggler
//! with its evidence, or that nobody is late), then every rank with its place, state,
//! last sequence numbers, how often it arrived last, its median lateness and a
//! sparkline of its lateness in the recent collectives. Drawing only, like `view`.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table};

use super::{Theme, fit, fit_tail};
use crate::state::State;
use neuron_datastore::flight::{JobAdmission, Position};
use neuron_datastore::ranks::{GroupView, RankState, format_ns};

/// What the Ranks tab says while no runtime has a communicator.
pub const NO_COMMUNICATOR: &str = "No communicator: the runtimes here run no collectives (or run none yet).";

/// The sparkline's levels, lowest first.
const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

pub(crate) fn draw(frame: &mut Frame, area: Rect, state: &State, theme: Theme) {
    let groups = &state.snapshot.ranks;
    if groups.is_empty() {
        frame.render_widget(Paragraph::new(Span::styled(fit(NO_COMMUNICATOR, area.width), theme.dim())), area);
        return;
    }
    let mut y = area.y;
    for group in groups {
        let left = area.bottom().saturating_sub(y);
        if left < 3 {
            break;
        }
        let lines = diagnosis(group, theme, area.width);
        let table_rows = (group.members.len() as u16 + 1).min(left.saturating_sub(lines.len() as u16 + 1));
        let height = (lines.len() as u16 + table_rows).min(left);
        let text_area = Rect { x: area.x, y, width: area.width, height: (lines.len() as u16).min(height) };
        let lines: Vec<Line> = lines.into_iter().map(|l| super::fit_line(l, area.width)).collect();
        frame.render_widget(Paragraph::new(lines), text_area);
        let table_area =
            Rect { x: area.x, y: y + text_area.height, width: area.width, height: height - text_area.height };
        draw_members(frame, table_area, group, theme);
        y += height + 1;
    }
}

/// The communicator's heading and diagnosis, wrapped to `width`.
fn diagnosis(group: &GroupView, theme: Theme, width: u16) -> Vec<Line<'static>> {
    let across = if group.across { "across processes" } else { "in one process" };
    let clock = match group.uncertainty_ns {
        0 => String::new(),
        u => format!(" · clocks within ±{}", format_ns(u)),
    };
    let heading = format!("{} · comm {} · {} ranks {across}{clock}", group.name, group.id, group.ranks);
    let mut lines = vec![Line::from(Span::styled(heading, theme.title()))];
    let mut say = |text: String, style| {
        lines.extend(wrap(&text, width).into_iter().map(|l| Line::from(Span::styled(l, style))));
    };
    match group.admission {
        Some(admission @ JobAdmission::TrustedNetwork) => {
            say(format!("the job {}", admission.describe()), theme.fg(Color::Yellow).add_modifier(Modifier::BOLD));
        }
        Some(admission) => say(format!("the job {}", admission.describe()), theme.dim()),
        None => {}
    }
    if let Some(hang) = &group.hang {
        say(
            format!("{} {}", hang.class.title().to_uppercase(), hang.text),
            theme.fg(Color::Red).add_modifier(Modifier::BOLD),
        );
    }
    match &group.straggler {
        Some(straggler) => {
            say(format!("STRAGGLER {}", straggler.text.clone()), theme.fg(Color::Yellow).add_modifier(Modifier::BOLD));
        }
        None if group.hang.is_none() => {
            let complete = group.collectives.iter().filter(|c| c.complete).count();
            lines.push(Line::from(Span::styled(
                format!("no straggler ({complete} complete collectives seen)"),
                theme.dim(),
            )));
        }
        None => {}
    }
    lines
}

fn draw_members(frame: &mut Frame, area: Rect, group: &GroupView, theme: Theme) {
    let fixed: [(&str, u16); 10] = [
        ("rank", 5),
        ("host", 12),
        ("pid", 8),
        ("nc", 4),
        ("state", 14),
        ("given", 8),
        ("reached", 8),
        ("done", 8),
        ("arr.last", 9),
        ("late p50", 10),
    ];
    let used: u16 = fixed.iter().map(|(_, w)| w).sum();
    let spark_width = area.width.saturating_sub(used).min(group.collectives.len() as u16);
    let max = group.members.iter().flat_map(|m| m.lateness_ns.iter().flatten()).copied().max().unwrap_or(0);
    let header = Row::new(fixed.iter().map(|(name, _)| Cell::from(*name)).chain([Cell::from(if spark_width >= 8 {
        "lateness"
    } else {
        ""
    })]))
    .style(theme.label());
    let straggler = group.straggler.as_ref().map(|s| s.rank);
    let awaited = group.hang.as_ref().map_or(&[][..], |h| h.awaited.as_slice());
    let rows = group.members.iter().map(|m| {
        let cells = [
            m.rank.to_string(),
            fit_tail(if m.host.is_empty() { "?" } else { &m.host }, 12),
            if m.pid == 0 { "?".into() } else { m.pid.to_string() },
            m.core.map_or_else(|| "-".into(), |c| format!("nc{c}")),
            m.state.name().to_string(),
            position(m.enqueued),
            position(m.started),
            position(m.completed),
            m.arrived_last.to_string(),
            m.median_lateness_ns.map_or_else(|| "-".into(), format_ns),
        ];
        let spark = sparkline(&m.lateness_ns, max, spark_width as usize);
        let row = Row::new(cells.into_iter().map(Cell::from).chain([Cell::from(spark)]));
        if awaited.contains(&m.rank) || m.state == RankState::Gone {
            row.style(theme.bad(true))
        } else if straggler == Some(m.rank) {
            row.style(theme.fg(Color::Yellow).add_modifier(Modifier::BOLD))
        } else {
            row
        }
    });
    let widths = fixed.iter().map(|(_, w)| Constraint::Length(*w)).chain([Constraint::Length(spark_width)]);
    frame.render_widget(Table::new(rows, widths).header(header), area);
}

fn position(p: Option<Position>) -> String {
    p.map_or_else(|| "-".into(), |p| p.to_string())
}

/// `text` cut into lines of at most `width` columns at spaces (a longer word is cut).
fn wrap(text: &str, width: u16) -> Vec<String> {
    let width = usize::from(width.max(1));
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let (line_len, word_len) = (line.chars().count(), word.chars().count());
        if !line.is_empty() && line_len + 1 + word_len > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines.into_iter().map(|l| fit(&l, width as u16)).collect()
}

/// The last `width` latenesses as a sparkline scaled to `max` (blank where unknown).
fn sparkline(lateness: &[Option<u64>], max: u64, width: usize) -> String {
    let start = lateness.len().saturating_sub(width);
    lateness[start..]
        .iter()
        .map(|l| match l {
            None => ' ',
            Some(_) if max == 0 => LEVELS[0],
            Some(l) => LEVELS[((*l as f64 / max as f64) * 7.0).round() as usize],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagnoses_wrap_at_spaces() {
        assert_eq!(wrap("rank 2 arrived last", 8), ["rank 2", "arrived", "last"]);
        assert_eq!(wrap("abcdefghij", 4), ["abc…"]);
    }

    #[test]
    fn the_sparkline_scales_to_the_groups_largest_lateness_and_keeps_the_latest() {
        assert_eq!(sparkline(&[Some(0), Some(50), None, Some(100)], 100, 8), "▁▅ █");
        assert_eq!(sparkline(&[Some(0), Some(50), None, Some(100)], 100, 2), " █");
        assert_eq!(sparkline(&[Some(0)], 0, 4), "▁");
    }
}
