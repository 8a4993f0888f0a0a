//! extend.lua's contract: renew the leases of deliveries whose handlers still run, and
//! detach from their claims those whose handlers ran past their timeout.

use super::complete::{Delivery, Statuses};
use super::{Call, Invocation, LuaScript};

/// Detach `detach` from their claims, then renew each of `deliveries` to `lease_ms`
/// from now. The reply is one `complete::Status` per delivery of both, in order:
/// `Done` detached or renewed, `LeaseLost`, or `Gone`.
#[derive(Debug, Clone)]
pub(crate) struct Args<'a> {
    pub(crate) lease_ms: u64,
    pub(crate) detach: Vec<Delivery<'a>>,
    pub(crate) deliveries: Vec<Delivery<'a>>,
}

impl Call for Args<'_> {
    type Reply = Statuses;

    fn script(&self) -> &'static LuaScript {
        script()
    }

    fn add_to(&self, inv: &mut Invocation<'_>) {
        inv.arg(self.lease_ms).arg(self.detach.len());
        for d in self.detach.iter().chain(&self.deliveries) {
            inv.arg(d.id).arg(d.lease);
        }
    }
}

/// The script.
pub(crate) fn script() -> &'static LuaScript {
    &super::EXTEND
}
