//! The Lua scripts, one file each, loaded with EVALSHA and reloaded on NOSCRIPT.

use std::sync::LazyLock;

use redis::Script;

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(concat!(include_str!("lua/lib.lua"), include_str!($file))));
    };
}

script!(PUSH, "lua/push.lua");
script!(CLAIM, "lua/claim.lua");
script!(ACK, "lua/ack.lua");
script!(NACK, "lua/nack.lua");
script!(RELEASE, "lua/release.lua");
script!(EXTEND, "lua/extend.lua");
script!(CANCEL, "lua/cancel.lua");
script!(RESCHEDULE, "lua/reschedule.lua");
script!(GET, "lua/get.lua");
script!(STATS, "lua/stats.lua");
script!(DEAD, "lua/dead.lua");
script!(REQUEUE, "lua/requeue.lua");
script!(DELETE_DEAD, "lua/delete_dead.lua");
script!(DEAD_MATCHING, "lua/dead_matching.lua");
script!(PURGE, "lua/purge.lua");
script!(BEAT, "lua/beat.lua");
script!(WORKERS, "lua/workers.lua");
script!(PAUSE, "lua/pause.lua");
script!(LIMIT, "lua/limit.lua");
script!(RESTART, "lua/restart.lua");
script!(LIST, "lua/list.lua");
script!(REPEAT_SET, "lua/repeat_set.lua");
script!(REPEAT_NEXT, "lua/repeat_next.lua");
script!(REPEAT_DEL, "lua/repeat_del.lua");
script!(REPEATS, "lua/repeats.lua");
script!(FIND, "lua/find.lua");

/// Most ids one script call handles; bounds how long any call blocks Redis.
pub const MAX_BATCH: usize = 1000;
