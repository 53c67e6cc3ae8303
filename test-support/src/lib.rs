//! What the workspace's tests and benchmarks share, in one place instead of copies:
//!
//! - [`process`]: real processes in a private [`Sandbox`](process::Sandbox) (core
//!   reservations and a datastore directory of their own), killed when dropped; the
//!   workspace's binaries built on demand; a process's CPU time and memory;
//! - [`runtime`]: a runtime in the test's own process, shared by a test binary
//!   ([`Bench`](runtime::Bench)) or one per test ([`Fixture`](runtime::Fixture)), and
//!   the helpers that compile, bind and run HLO on it;
//! - [`http`]: a plain `GET` against a local server;
//! - [`hosts`]: two network namespaces joined by a veth pair, as two hosts;
//! - [`python`]: Python environments with pinned packages, made once and kept;
//! - [`ci`]: whether this is CI's run, where a missing tool fails the test instead of
//!   skipping its part.
//!
//! It is a dev-dependency only (`publish = false`); nothing here is part of any
//! product.

pub mod ci;
pub mod hosts;
pub mod http;
pub mod process;
pub mod python;
pub mod runtime;
