//! The worker host: what runs around a binding's handlers, the same for every language.
//!
//! - `options.rs`: the table of worker options (name, kind, range, default, doc line)
//!   that both bindings read;
//! - `run.rs`: the handler-run policy: what a handler's outcome does to its message
//!   ([`settle`]), and when a process's run ends ([`Recycle`], [`ended_by`]);
//! - `serve.rs`: the receive loop of one process over a binding's [`Handler`];
//! - `stop.rs`: why a run ended ([`StopReason`]), one enum shown as `stopped_by`;
//! - `slot.rs`: memory shared between a supervised process and its supervisor (the
//!   running handler, the delivery it holds, the process's counts);
//! - `report.rs`: what a supervised process tells its supervisor when it ends;
//! - `supervisor.rs`: the process supervisor (spawn through the binding, reap, the
//!   hung-handler kill, scaling, one summary), with `respawn.rs` (when a dead process
//!   is started again, and when the pool gives up: never on deaths in a handler),
//!   `hung.rs` (the hung-handler clock, the timeout errors) and `signals.rs` (a first
//!   and a second stop signal).

mod hung;
mod options;
mod report;
mod respawn;
mod run;
mod serve;
mod signals;
mod slot;
mod stop;
mod supervisor;

pub use hung::{CANCEL_GRACE, COROUTINE_GRACE, HungClock, cancel_error, timeout_error};
pub use options::{WORKER_OPTIONS, WorkerSettings, worker_option};
pub use report::Report;
pub use respawn::{Death, Respawn, RespawnPolicy, Respawns};
pub use run::{AfterSettle, Outcome, Recycle, Verdict, after_settle, ended_by, settle};
pub use serve::{Called, Handler, Served, serve};
pub use signals::{StopSignals, URGENT_AFTER, stop_with_supervisor};
pub use slot::{Held, Publisher, Slot, SlotTable, SlotView};
pub use stop::StopReason;
pub use supervisor::{Asked, LOOK_EVERY, PoolSummary, Spawner, SupervisorOptions, is_supervised, supervise};
