//! `neuron-monitor`'s report model: the configuration (`config`), the metric groups in
//! the JSON shapes of the Neuron tool's reports (`report`), and the Prometheus
//! series of a report (`prometheus`) in the text and OpenMetrics formats (`exposition`), and the ranks of the followed runtimes'
//! communicators (`collectives`). Runtime processes and the host are read
//! through `neuron-datastore` only (its reader API and its `/proc` figures).

pub mod collectives;
pub mod config;
pub mod exposition;
pub mod prometheus;
pub mod report;
