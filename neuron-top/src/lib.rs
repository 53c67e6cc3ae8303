//! `neuron-top`: data collection (`collect`) fills plain records (`model`); the UI's
//! state (`state`) changes only through actions from one key table (`input`); drawing
//! (`view`) reads the state and nothing else; `term` takes the terminal over and gives
//! it back.

pub mod collect;
pub mod input;
pub mod model;
pub mod state;
pub mod term;
pub mod view;
