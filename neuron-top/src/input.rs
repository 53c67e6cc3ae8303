//! Keys: one table maps them to a closed set of actions, and the help screen is drawn
//! from the same table, so the two cannot disagree.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

/// Everything a key can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Quit,
    ToggleHelp,
    CloseHelp,
    PreviousTab,
    NextTab,
    /// Tab `n`, counting from 1 (`[1]:all`).
    SelectTab(u8),
    /// The Ranks tab.
    RanksTab,
    Up,
    Down,
    Collapse,
    Expand,
    ToggleNode,
    ToggleAll,
    ToggleFlops,
    /// Sort the process table by its next column.
    NextSort,
}

/// A key: a code and whether Ctrl is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub code: KeyCode,
    pub ctrl: bool,
}

const fn key(c: char) -> Key {
    Key { code: KeyCode::Char(c), ctrl: false }
}

const fn code(code: KeyCode) -> Key {
    Key { code, ctrl: false }
}

/// One row of the key table.
#[derive(Debug)]
pub struct Binding {
    pub keys: &'static [Key],
    /// How the help screen names the keys.
    pub label: &'static str,
    pub help: &'static str,
    /// The action of a key of this row (`SelectTab` takes the digit).
    action: fn(Key) -> Option<Action>,
}

/// The key table: input handling and the help screen both read it.
pub const BINDINGS: &[Binding] = &[
    Binding {
        keys: &[key('q'), Key { code: KeyCode::Char('c'), ctrl: true }],
        label: "q, Ctrl-C",
        help: "quit",
        action: |_| Some(Action::Quit),
    },
    Binding { keys: &[key('?')], label: "?", help: "show or hide this help", action: |_| Some(Action::ToggleHelp) },
    Binding { keys: &[code(KeyCode::Esc)], label: "Esc", help: "close the help", action: |_| Some(Action::CloseHelp) },
    Binding {
        keys: &[code(KeyCode::BackTab), key('a')],
        label: "Shift-Tab, a",
        help: "previous tab",
        action: |_| Some(Action::PreviousTab),
    },
    Binding {
        keys: &[code(KeyCode::Tab), key('d')],
        label: "Tab, d",
        help: "next tab",
        action: |_| Some(Action::NextTab),
    },
    Binding {
        keys: &[key('1'), key('2'), key('3'), key('4'), key('5'), key('6'), key('7'), key('8'), key('9')],
        label: "1-9",
        help: "select a tab: [1] is all runtimes, then one per runtime",
        action: |k| match k.code {
            KeyCode::Char(c) => c.to_digit(10).map(|d| Action::SelectTab(d as u8)),
            _ => None,
        },
    },
    Binding {
        keys: &[key('r')],
        label: "r",
        help: "the ranks tab: each communicator's ranks, stragglers and hangs",
        action: |_| Some(Action::RanksTab),
    },
    Binding {
        keys: &[code(KeyCode::Up), key('k')],
        label: "↑, k",
        help: "move up in the memory tree",
        action: |_| Some(Action::Up),
    },
    Binding {
        keys: &[code(KeyCode::Down), key('j')],
        label: "↓, j",
        help: "move down in the memory tree",
        action: |_| Some(Action::Down),
    },
    Binding {
        keys: &[code(KeyCode::Left), key('h')],
        label: "←, h",
        help: "collapse the selected node",
        action: |_| Some(Action::Collapse),
    },
    Binding {
        keys: &[code(KeyCode::Right), key('l')],
        label: "→, l",
        help: "expand the selected node",
        action: |_| Some(Action::Expand),
    },
    Binding {
        keys: &[code(KeyCode::Enter)],
        label: "Enter",
        help: "expand or collapse the selected node",
        action: |_| Some(Action::ToggleNode),
    },
    Binding {
        keys: &[key('x')],
        label: "x",
        help: "expand or collapse the whole tree",
        action: |_| Some(Action::ToggleAll),
    },
    Binding {
        keys: &[key('f')],
        label: "f",
        help: "core bars: FLOP/s against the peak, or utilisation",
        action: |_| Some(Action::ToggleFlops),
    },
    Binding {
        keys: &[key('s')],
        label: "s",
        help: "sort the process table (tall terminals) by its next column",
        action: |_| Some(Action::NextSort),
    },
];

/// The action of a key press, if the table has one.
pub fn action(event: KeyEvent) -> Option<Action> {
    if event.kind == KeyEventKind::Release {
        return None;
    }
    let pressed = Key { code: event.code, ctrl: event.modifiers.contains(KeyModifiers::CONTROL) };
    BINDINGS.iter().find(|b| b.keys.contains(&pressed)).and_then(|b| (b.action)(pressed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(code: KeyCode, modifiers: KeyModifiers) -> Option<Action> {
        action(KeyEvent::new(code, modifiers))
    }

    #[test]
    fn every_key_of_the_table_has_its_action() {
        assert_eq!(press(KeyCode::Char('q'), KeyModifiers::NONE), Some(Action::Quit));
        assert_eq!(press(KeyCode::Char('c'), KeyModifiers::CONTROL), Some(Action::Quit));
        assert_eq!(press(KeyCode::Char('c'), KeyModifiers::NONE), None, "c alone does nothing");
        assert_eq!(press(KeyCode::Char('7'), KeyModifiers::NONE), Some(Action::SelectTab(7)));
        assert_eq!(press(KeyCode::Char('j'), KeyModifiers::NONE), Some(Action::Down));
        assert_eq!(press(KeyCode::Char('r'), KeyModifiers::NONE), Some(Action::RanksTab));
        assert_eq!(press(KeyCode::Left, KeyModifiers::NONE), Some(Action::Collapse));
        assert_eq!(press(KeyCode::Char('0'), KeyModifiers::NONE), None);
        // Tab and Shift-Tab switch tabs, as in nvtop and btop (terminals send Shift-Tab
        // as BackTab, with or without the Shift modifier).
        assert_eq!(press(KeyCode::Tab, KeyModifiers::NONE), Some(Action::NextTab));
        assert_eq!(press(KeyCode::BackTab, KeyModifiers::SHIFT), Some(Action::PreviousTab));
        assert_eq!(press(KeyCode::BackTab, KeyModifiers::NONE), Some(Action::PreviousTab));
        for binding in BINDINGS {
            for &k in binding.keys {
                let modifiers = if k.ctrl { KeyModifiers::CONTROL } else { KeyModifiers::NONE };
                assert!(press(k.code, modifiers).is_some(), "{} has no action", binding.label);
            }
        }
    }

    #[test]
    fn a_key_belongs_to_one_row_only() {
        let all: Vec<Key> = BINDINGS.iter().flat_map(|b| b.keys.iter().copied()).collect();
        for (i, k) in all.iter().enumerate() {
            assert!(!all[i + 1..].contains(k), "{k:?} is bound twice");
        }
    }
}
