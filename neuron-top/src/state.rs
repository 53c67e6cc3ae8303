//! The UI's state: the latest snapshot and what the user chose to look at. Pure: actions
//! and new snapshots go in, nothing comes out but the state; drawing reads it.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::input::Action;
use neuron_datastore::sample::model::{DeviceMemory, Runtime, Snapshot};

/// A node of the memory tree that can be expanded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeId {
    Device(u32),
    /// A core, by its runtime's pid and its index (a core freed by an exited runtime
    /// may already belong to a new one).
    Core(u32, u32),
    /// A model, by its runtime's pid, core and model id.
    Model(u32, u32, u32),
}

/// One line of the memory tree.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeRow {
    /// `None` for a category line, which has no children.
    pub node: Option<NodeId>,
    /// What the line stands for, the same across snapshots (the cursor follows it).
    pub key: String,
    pub depth: u16,
    pub label: String,
    pub expanded: bool,
    pub model_id: Option<u32>,
    pub device_bytes: Option<u64>,
    pub host_bytes: Option<u64>,
}

/// The process table's sort column; each sorts descending but the name and pid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProcessSort {
    #[default]
    Executions,
    Cpu,
    Memory,
    Name,
    Pid,
}

impl ProcessSort {
    const ALL: [ProcessSort; 5] =
        [ProcessSort::Executions, ProcessSort::Cpu, ProcessSort::Memory, ProcessSort::Name, ProcessSort::Pid];

    fn next(self) -> ProcessSort {
        let at = ProcessSort::ALL.iter().position(|&s| s == self).unwrap_or(0);
        ProcessSort::ALL[(at + 1) % ProcessSort::ALL.len()]
    }

    /// The runtimes in this order.
    pub fn order(self, mut runtimes: Vec<&Runtime>) -> Vec<&Runtime> {
        let executions = |r: &Runtime| r.cores.iter().filter_map(|c| c.executions_per_second).sum::<f64>();
        let cpu = |r: &Runtime| r.vcpu.map_or(0.0, |c| c.user + c.system);
        let memory = |r: &Runtime| r.cores.iter().map(|c| c.device_memory.total()).sum::<u64>();
        match self {
            ProcessSort::Executions => runtimes.sort_by(|a, b| executions(b).total_cmp(&executions(a))),
            ProcessSort::Cpu => runtimes.sort_by(|a, b| cpu(b).total_cmp(&cpu(a))),
            ProcessSort::Memory => runtimes.sort_by_key(|r| std::cmp::Reverse(memory(r))),
            ProcessSort::Name => runtimes.sort_by(|a, b| a.tag.cmp(&b.tag)),
            ProcessSort::Pid => runtimes.sort_by_key(|r| r.pid),
        }
        runtimes
    }
}

/// Time between two looks at the runtimes, unless `--refresh` says otherwise.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Default)]
pub struct State {
    pub snapshot: Snapshot,
    /// Time between two samples of the history graphs.
    pub refresh: Duration,
    /// The runtime of the selected tab, by pid; `None` for `[1]:all` and the Ranks tab.
    pub selected: Option<u32>,
    /// The Ranks tab is selected (the last tab, there while a communicator is
    /// recorded).
    pub ranks_tab: bool,
    pub show_help: bool,
    /// Core bars show TFLOPS instead of utilisation.
    pub flops: bool,
    /// The column the process table is sorted by.
    pub sort: ProcessSort,
    /// The selected line of the memory tree, and what it stands for.
    pub cursor: usize,
    cursor_key: Option<String>,
    /// Nodes the user expanded (devices start expanded, so for them: collapsed).
    toggled: BTreeSet<NodeId>,
    pub quit: bool,
}

impl State {
    pub fn new(snapshot: Snapshot) -> State {
        State { snapshot, refresh: DEFAULT_REFRESH, ..State::default() }
    }

    /// Takes a new snapshot, staying on the same runtime if it is still there.
    pub fn update(&mut self, snapshot: Snapshot) {
        self.snapshot = snapshot;
        if let Some(pid) = self.selected
            && !self.snapshot.runtimes.iter().any(|r| r.pid == pid)
        {
            self.selected = None;
        }
        if self.snapshot.ranks.is_empty() {
            self.ranks_tab = false;
        }
        // The cursor stays on the same line when lines come or go above it.
        let rows = self.tree();
        let found = self.cursor_key.as_ref().and_then(|key| rows.iter().position(|r| &r.key == key));
        self.cursor = found.unwrap_or(self.cursor).min(rows.len().saturating_sub(1));
        self.cursor_key = rows.get(self.cursor).map(|r| r.key.clone());
    }

    pub fn apply(&mut self, action: Action) {
        if self.show_help {
            match action {
                Action::Quit => self.quit = true,
                Action::ToggleHelp | Action::CloseHelp => self.show_help = false,
                _ => {}
            }
            return;
        }
        let tabs = self.tabs();
        match action {
            Action::Quit => self.quit = true,
            Action::ToggleHelp => self.show_help = true,
            Action::CloseHelp => {}
            Action::PreviousTab => self.select_tab((self.tab() + tabs - 1) % tabs),
            Action::NextTab => self.select_tab((self.tab() + 1) % tabs),
            Action::SelectTab(n) => {
                if (1..=tabs).contains(&(n as usize)) {
                    self.select_tab(n as usize - 1);
                }
            }
            Action::RanksTab => {
                if !self.snapshot.ranks.is_empty() {
                    self.select_tab(tabs - 1);
                }
            }
            Action::Up => self.cursor = self.cursor.saturating_sub(1),
            Action::Down => self.cursor = (self.cursor + 1).min(self.tree().len().saturating_sub(1)),
            Action::Collapse | Action::Expand | Action::ToggleNode => {
                if let Some(row) = self.tree().get(self.cursor)
                    && let Some(node) = row.node
                {
                    let want = match action {
                        Action::Collapse => false,
                        Action::Expand => true,
                        _ => !row.expanded,
                    };
                    if want != row.expanded {
                        self.flip(node);
                    }
                }
            }
            Action::ToggleAll => {
                let rows = self.all_nodes();
                let all_open = rows.iter().all(|n| self.is_expanded(*n));
                for node in rows {
                    if self.is_expanded(node) == all_open {
                        self.flip(node);
                    }
                }
            }
            Action::ToggleFlops => self.flops = !self.flops,
            Action::NextSort => self.sort = self.sort.next(),
        }
        let rows = self.tree();
        self.cursor = self.cursor.min(rows.len().saturating_sub(1));
        self.cursor_key = rows.get(self.cursor).map(|r| r.key.clone());
    }

    /// The number of tabs: all, one per runtime, and Ranks while a communicator is
    /// recorded.
    pub fn tabs(&self) -> usize {
        self.snapshot.runtimes.len() + 1 + usize::from(!self.snapshot.ranks.is_empty())
    }

    /// The selected tab: 0 for all, then one per runtime in snapshot order, then Ranks.
    pub fn tab(&self) -> usize {
        if self.ranks_tab {
            return self.snapshot.runtimes.len() + 1;
        }
        self.selected.and_then(|pid| self.snapshot.runtimes.iter().position(|r| r.pid == pid)).map_or(0, |i| i + 1)
    }

    fn select_tab(&mut self, tab: usize) {
        self.ranks_tab = !self.snapshot.ranks.is_empty() && tab == self.snapshot.runtimes.len() + 1;
        self.selected = tab.checked_sub(1).and_then(|i| self.snapshot.runtimes.get(i)).map(|r| r.pid);
        self.cursor = 0;
    }

    /// The runtimes the selected tab shows.
    pub fn runtimes(&self) -> Vec<&Runtime> {
        self.snapshot.runtimes.iter().filter(|r| self.selected.is_none_or(|pid| r.pid == pid)).collect()
    }

    fn is_expanded(&self, node: NodeId) -> bool {
        let by_default = matches!(node, NodeId::Device(_));
        by_default != self.toggled.contains(&node)
    }

    fn flip(&mut self, node: NodeId) {
        if !self.toggled.remove(&node) {
            self.toggled.insert(node);
        }
    }

    /// Every expandable node of the selected runtimes, expanded or not.
    fn all_nodes(&self) -> Vec<NodeId> {
        let mut nodes = BTreeSet::new();
        for runtime in self.runtimes() {
            for core in &runtime.cores {
                nodes.insert(NodeId::Device(core.device));
                nodes.insert(NodeId::Core(runtime.pid, core.index));
            }
            for model in &runtime.models {
                nodes.insert(NodeId::Model(runtime.pid, model.core, model.model_id));
            }
        }
        nodes.into_iter().collect()
    }

    /// The memory tree as shown: devices, their cores, each core's categories and
    /// models, each model's categories, as far as they are expanded. A device's device
    /// memory is the sum of its cores'; a core's, the sum of its categories, which hold
    /// its models' memory too. Host memory is the models'.
    pub fn tree(&self) -> Vec<TreeRow> {
        let runtimes = self.runtimes();
        let mut devices: Vec<u32> = runtimes.iter().flat_map(|r| r.cores.iter().map(|c| c.device)).collect();
        devices.sort_unstable();
        devices.dedup();
        let categories = |rows: &mut Vec<TreeRow>, memory: &DeviceMemory, depth: u16, parent: &str| {
            for (name, bytes) in memory.categories() {
                rows.push(TreeRow {
                    node: None,
                    key: format!("{parent}/{name}"),
                    depth,
                    label: name.to_string(),
                    expanded: false,
                    model_id: None,
                    device_bytes: Some(bytes),
                    host_bytes: None,
                });
            }
        };
        let mut rows = Vec::new();
        for device in devices {
            let cores: Vec<_> = runtimes
                .iter()
                .flat_map(|r| r.cores.iter().map(move |c| (r, c)))
                .filter(|(_, c)| c.device == device)
                .collect();
            let mut total = DeviceMemory::default();
            cores.iter().for_each(|(_, c)| total.add(&c.device_memory));
            let node = NodeId::Device(device);
            let open = self.is_expanded(node);
            rows.push(TreeRow {
                node: Some(node),
                key: format!("{node:?}"),
                depth: 0,
                label: format!("ND{device} (sum of {} core{})", cores.len(), if cores.len() == 1 { "" } else { "s" }),
                expanded: open,
                model_id: None,
                device_bytes: Some(total.total()),
                host_bytes: None,
            });
            if !open {
                continue;
            }
            for (runtime, core) in cores {
                let node = NodeId::Core(runtime.pid, core.index);
                let open = self.is_expanded(node);
                let models: Vec<_> = runtime.models.iter().filter(|m| m.core == core.index).collect();
                let key = format!("{node:?}");
                rows.push(TreeRow {
                    node: Some(node),
                    key: key.clone(),
                    depth: 1,
                    label: format!("nc{} {} (sum of categories)", core.index, runtime.tag),
                    expanded: open,
                    model_id: None,
                    device_bytes: Some(core.device_memory.total()),
                    host_bytes: None,
                });
                if !open {
                    continue;
                }
                categories(&mut rows, &core.device_memory, 2, &key);
                for model in models {
                    let node = NodeId::Model(runtime.pid, model.core, model.model_id);
                    let open = self.is_expanded(node);
                    let key = format!("{node:?}");
                    rows.push(TreeRow {
                        node: Some(node),
                        key: key.clone(),
                        depth: 2,
                        label: model.name.clone(),
                        expanded: open,
                        model_id: Some(model.model_id),
                        device_bytes: Some(model.device_memory.total()),
                        host_bytes: Some(model.host_memory),
                    });
                    if open {
                        categories(&mut rows, &model.device_memory, 3, &key);
                    }
                }
            }
        }
        rows
    }
}
