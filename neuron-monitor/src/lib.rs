//! `neuron-monitor`'s report model: the configuration (`config`), the metric groups in
//! the JSON shapes of the Neuron tool's reports (`report`), the host figures they need
//! from `/proc` (`host`), and the Prometheus exposition of a report (`prometheus`).
//! The runtime processes are read through the runtime's datastore reader API only.

pub mod config;
pub mod host;
pub mod prometheus;
pub mod report;
