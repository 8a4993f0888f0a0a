//! What a run of `DelayQueueWorker` or `DelayQueueConsumer` returns (mirrors the
//! core's `Summary`): one process's counts and why it ended (`RunSummary`), and the
//! summary as PHP's array, with a supervised pool's own counts (`summary_array`).

use delayq::host::StopReason;
use ext_php_rs::boxed::ZBox;
use ext_php_rs::exception::PhpException;
use ext_php_rs::types::ZendHashTable;

type PhpResult<T> = Result<T, PhpException>;

/// The counts of one process's run.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunSummary {
    pub(crate) core: delayq::Summary,
    pub(crate) ended: Option<StopReason>,
}

/// A run's summary as PHP's array; a supervised pool adds the supervisor's counts.
pub(crate) fn summary_array(
    s: &RunSummary,
    pool: Option<&delayq::host::PoolSummary>,
) -> PhpResult<ZBox<ZendHashTable>> {
    crate::records::record(delayq::records::summary(&s.core, s.ended, pool))
}
