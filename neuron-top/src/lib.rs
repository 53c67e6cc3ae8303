//! `neuron-top`: the sampled figures come from `neuron-datastore`'s sampler
//! (`neuron_datastore::sample`); the UI's state (`state`) changes only through actions
//! from one key table (`input`); drawing (`view`, and `view::panels` for what a tall
//! terminal adds) reads the state and nothing else;
//! `term` takes the terminal over and gives it back.

pub mod input;
pub mod state;
pub mod term;
pub mod view;
