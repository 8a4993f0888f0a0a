//! orphans.lua's contract: end the deliveries of claimed ids that turned out to have
//! no envelope (see claim.lua: its caller reads the envelopes).

use super::complete::Delivery;
use super::replies::Count;
use super::{Call, Invocation, LuaScript};

/// The deliveries to end; the reply counts those ended.
#[derive(Debug, Clone)]
pub(crate) struct Args<'a> {
    pub(crate) deliveries: Vec<Delivery<'a>>,
}

impl Call for Args<'_> {
    type Reply = Count;

    fn script(&self) -> &'static LuaScript {
        script()
    }

    fn add_to(&self, inv: &mut Invocation<'_>) {
        for d in &self.deliveries {
            inv.arg(d.id).arg(d.lease);
        }
    }
}

/// The script.
pub(crate) fn script() -> &'static LuaScript {
    &super::ORPHANS
}
