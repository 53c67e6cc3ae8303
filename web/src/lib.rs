//! The web dashboard: an axum server with its page embedded in the binary.
//!
//! - `/api/live`: Server-Sent Events, a look at every runtime on the host per update
//!   (`live`);
//! - `/api/events`: Server-Sent Events, batches of system and device spans as the
//!   runtimes emit them (`events`);
//! - `/api/profiles/…`: the NTFF files of the profiles directory, indexed for a timeline
//!   with server-side level of detail (`index`, `profiles`).
//!
//! It reads runtimes through the datastore reader API and profiles through `ntff`, and
//! knows nothing else of the runtime. Security: loopback unless a token is set; a token,
//! when set, is required on every request; profile names resolve only inside the
//! profiles directory; event streams and request sizes are bounded.

mod events;
mod index;
mod live;
mod profiles;
mod server;

pub use server::{Dashboard, Options};
