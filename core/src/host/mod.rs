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
//! - `supervisor.rs`: the process supervisor (spawn through the binding, respawn,
//!   back-off and give-up, the hung-handler kill, scaling, one summary).

mod options;
mod report;
mod run;
mod serve;
mod slot;
mod stop;
mod supervisor;

pub use options::{WORKER_OPTIONS, worker_option};
pub use report::Report;
pub use run::{Outcome, Recycle, Verdict, ended_by, settle};
pub use serve::{Called, Handler, Served, serve};
pub use slot::{Held, Publisher, Slot, SlotTable, SlotView};
pub use stop::StopReason;
pub use supervisor::{
    Asked, HungClock, LOOK_EVERY, PoolSummary, Respawn, RespawnPolicy, Respawns, Spawner, StopSignals,
    SupervisorOptions, URGENT_AFTER, is_supervised, supervise, timeout_error,
};
