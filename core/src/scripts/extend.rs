//! extend.lua's contract: renew the leases of deliveries whose handlers still run.

use super::complete::{Delivery, Statuses};
use super::{Call, LuaScript};

/// Renew each delivery's lease to `lease_ms` from now. The reply is one
/// `complete::Status` per delivery: `Done` renewed, `LeaseLost`, or `Gone`.
#[derive(Debug, Clone)]
pub(crate) struct Args<'a> {
    pub(crate) lease_ms: u64,
    pub(crate) deliveries: Vec<Delivery<'a>>,
}

impl Call for Args<'_> {
    type Reply = Statuses;

    fn script(&self) -> &'static LuaScript {
        script()
    }

    fn add_to(&self, inv: &mut redis::ScriptInvocation<'_>) {
        inv.arg(self.lease_ms);
        for d in &self.deliveries {
            inv.arg(d.id).arg(d.lease);
        }
    }
}

/// The script.
pub(crate) fn script() -> &'static LuaScript {
    &super::EXTEND
}
