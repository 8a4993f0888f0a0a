//! The fetcher threads: check access at start, claim due messages into the prefetch
//! buffer, hand them out (burying the unreadable and expired), push repeats' next
//! occurrences, and sleep until the next due time.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::conn::ConnSlot;
use crate::error::{Category, Error, Result};
use crate::keys::Layout;
use crate::metrics::Batch;
use crate::queue::Queue;
use crate::scripts::replies::Count;
use crate::scripts::{claim, complete, orphans};
use crate::{envelope, repeat};

use super::CancelFlag;
use super::complete::Outcome;
use super::control::Control;
use super::delivery::Ticket;
use super::options::WorkerOptions;
use super::pool::{
    ClaimUnderWay, EMPTY_POLL, Outstanding, PAUSED, Pool, QUARANTINE_RECHECK, YIELD_RECHECK, queue_now_ms, take_tickets,
};
use super::wake::Pick;
use super::{Delivery, is_setup_fault, pause_unless_stopped, run_call};

/// The longest a seed-layout pool waits between looks (see `fetch_loop`).
const SEED_LOOK: Duration = Duration::from_secs(1);

/// Before a pool starts: a claim of nothing on each partition, so that a user who
/// may not run the scripts, or a stray key, fails the start with that error instead
/// of a retry loop, and the worker learns which restart requests came before it
/// (unless an earlier start, `Worker::mark_start`, did). A pool that reads the sizes
/// of what it claims (`reads_sizes`) asks one first, so that a user whose rule lacks
/// HSTRLEN fails the start too, not every claim. Other errors (Redis unreachable) are
/// left to the fetchers, which retry.
pub(super) fn check_access(queue: &Queue, opts: &WorkerOptions, control: &Control) -> Result<()> {
    let lease = opts.lease;
    let qo = queue.options();
    let mut slot = ConnSlot::new();
    if reads_sizes(opts) {
        // Before the claims, which may write. A stray key is left to them: their
        // error names it.
        let messages = queue.inner.parts[0].messages();
        let probe = slot.run_once(&queue.inner.endpoint, "claim", |con| {
            redis::cmd("HSTRLEN").arg(messages).arg("").query::<u64>(con)
        });
        if let Err(e) = probe
            && e.category() == Category::Auth
        {
            return Err(e);
        }
    }
    for part in 0..queue.partitions() {
        let args = claim::Args {
            batch: 0,
            lease_ms: lease.as_millis() as u64,
            dead_max: qo.dead_max,
            dead_ttl_ms: qo.dead_ttl.as_millis() as u64,
            check_repeats: false,
            heartbeat: None,
            minutes: None,
            quarantine: claim::Quarantine::None,
            most_bytes: None,
        };
        match run_call(&mut slot, queue, part, &args) {
            Ok(reply) => {
                let _ = control.restart_baseline[part].set(reply.restart_generation);
            }
            Err(e) if is_setup_fault(&e) => return Err(e),
            // Unreachable: the other partitions would each wait out the same timeout.
            Err(e) if e.is_connection() || e.is_timeout() => break,
            Err(_) => {}
        }
    }
    Ok(())
}

/// One claim of up to `want` messages on partition `part`, its heartbeat and its
/// per-minute records carried when due: an idle pool's looks are all it sends. Returns
/// the reply, its envelopes read, and when it came. `quarantine` says which
/// quarantined messages it may take (see `Pool::quarantine_turn`).
pub(super) fn claim(
    pool: &Pool,
    slot: &mut ConnSlot,
    part: usize,
    want: usize,
    quarantine: claim::Quarantine,
) -> Result<(claim::Reply, Instant)> {
    let q = &pool.queue;
    let qo = q.options();
    let beat = pool.registration.take_pending(pool);
    let now_ms = queue_now_ms(pool);
    let minutes = pool.minutes.take_for_claim(part, now_ms);
    let deltas = minutes.as_ref().map(Batch::encoded);
    let args = claim::Args {
        batch: want,
        lease_ms: pool.opts.lease.as_millis() as u64,
        dead_max: qo.dead_max,
        dead_ttl_ms: qo.dead_ttl.as_millis() as u64,
        check_repeats: pool.repeat_check_due(part),
        heartbeat: beat.as_ref().map(|(id, ttl, info)| (*id, *ttl, info.as_str())),
        minutes: deltas.as_deref().map(|d| (crate::metrics::KEEP_MINUTES, d)),
        quarantine,
        most_bytes: reads_sizes(&pool.opts).then(|| read_bound(&pool.opts)),
    };
    let mut reply = match run_call(slot, q, part, &args) {
        Ok(reply) => reply,
        Err(e) => {
            if let Some((_, _, info)) = beat {
                pool.registration.put_back(info);
            }
            if let Some(batch) = minutes {
                pool.minutes.put_back(batch, now_ms);
            }
            return Err(e);
        }
    };
    let replied = Instant::now();
    // Written by the claim, whatever becomes of its envelopes.
    if let Some(minute) = reply.minute {
        pool.minutes.sent(part, minute);
    }
    if reply.unread
        && let Err(e) = read_envelopes(pool, slot, part, &mut reply)
    {
        // The reply is dropped with its repeats whose chain broke: look again soon.
        pool.recheck_repeats_soon(part);
        return Err(e);
    }
    Ok((reply, replied))
}

/// The room an envelope takes beside its payload (its id, stamp and options): a stored
/// message longer than `max_payload_bytes` by more is not read.
const ENVELOPE_ROOM: usize = 4096;

/// The envelopes a claim left to its caller (see claim.lua): read right after the
/// claim, on its connection, with one HMGET; a pool whose `max_payload_bytes` is below
/// the largest first asks their sizes (HSTRLEN, pipelined) and leaves unread those too
/// large to hand out, which `hand_out` buries. Ids found without one end their
/// deliveries (orphans.lua). A failed read is not tried again, which could hand out a
/// message after its lease passed on (or, after a failover, one the new master never
/// saw claimed): the deliveries are given back at once (release.lua, fenced by the
/// leases), or, if that fails too, expire and are delivered again.
fn read_envelopes(pool: &Pool, slot: &mut ConnSlot, part: usize, reply: &mut claim::Reply) -> Result<()> {
    let q = &pool.queue;
    let messages = q.inner.parts[part].messages();
    let mut unloaded = Vec::new();
    let read = slot
        .run_once(&q.inner.endpoint, "claim", |con| {
            if reads_sizes(&pool.opts) && !reply.items.is_empty() {
                let mut sizes = redis::pipe();
                for item in &reply.items {
                    sizes.cmd("HSTRLEN").arg(messages).arg(&item.id);
                }
                let sizes: Vec<u64> = crate::conn::query_one_slot(con, &sizes)?;
                unloaded = set_aside_larger(reply, &sizes, read_bound(&pool.opts));
            }
            if reply.items.is_empty() {
                return Ok(redis::Value::Array(Vec::new()));
            }
            reply.envelopes_query(messages).query::<redis::Value>(con)
        })
        .and_then(|v| {
            reply.take_envelopes(v).map_err(|e| Error::Protocol {
                script: "claim".to_owned(),
                reason: format!("reading the envelopes: {e}"),
            })
        });
    // Handed out after the others, in the claim's reply.
    reply.items.append(&mut unloaded);
    match read {
        Ok(orphans) => {
            end_orphans(pool, slot, part, &orphans);
            Ok(())
        }
        Err(e) => {
            let args = complete::Release {
                deliveries: reply.items.iter().map(claim::Claimed::delivery).collect(),
            };
            if let Err(release) = run_call(slot, q, part, &args) {
                log::warn!(
                    "delayq[{}]: {} claimed messages could not be read ({e}) nor given back ({release}); they run \
                     again once their lease expires",
                    pool.queue_name,
                    reply.items.len()
                );
            }
            Err(e)
        }
    }
}

/// Whether a pool asks the sizes of the envelopes it claims before it reads them: at
/// the largest bound no envelope can be past it.
fn reads_sizes(opts: &WorkerOptions) -> bool {
    opts.max_payload_bytes < crate::MAX_PAYLOAD_BYTES
}

/// The longest envelope a pool reads.
fn read_bound(opts: &WorkerOptions) -> u64 {
    u64::try_from(opts.max_payload_bytes.saturating_add(ENVELOPE_ROOM)).unwrap_or(u64::MAX)
}

/// Takes out of `reply` the items whose envelope is longer than `most` bytes (`sizes`
/// in the items' order, as HSTRLEN tells them), marked with their size; a reply of
/// the wrong length takes none out (the read that follows refuses it).
fn set_aside_larger(reply: &mut claim::Reply, sizes: &[u64], most: u64) -> Vec<claim::Claimed> {
    if sizes.len() != reply.items.len() || sizes.iter().all(|&size| size <= most) {
        return Vec::new();
    }
    let (mut kept, mut larger) = (Vec::new(), Vec::new());
    for (mut item, &size) in std::mem::take(&mut reply.items).into_iter().zip(sizes) {
        if size > most {
            item.unloaded = Some(size);
            larger.push(item);
        } else {
            kept.push(item);
        }
    }
    reply.items = kept;
    larger
}

/// End the deliveries of claimed ids that have no envelope; a failure leaves them to
/// their lease's expiry, after which the next claim finds them again.
fn end_orphans(pool: &Pool, slot: &mut ConnSlot, part: usize, orphans: &[claim::Claimed]) {
    if orphans.is_empty() {
        return;
    }
    let args = orphans::Args {
        deliveries: orphans.iter().map(claim::Claimed::delivery).collect(),
    };
    match run_call(slot, &pool.queue, part, &args) {
        Ok(Count(0)) => {}
        Ok(Count(n)) => log::warn!(
            "delayq[{}]: {n} scheduled id(s) without a message (written by hand or by another tool) dropped",
            pool.queue_name
        ),
        Err(e) => log::warn!(
            "delayq[{}]: {} scheduled id(s) without a message could not be dropped: {e}",
            pool.queue_name,
            orphans.len()
        ),
    }
}

/// Claims due messages into the prefetch buffer. Partitions are taken in rotation
/// among those due; when none is due the fetcher sleeps until the earliest known due
/// time or an announcement, so an idle pool sends Redis nothing but the periodic look.
pub(super) fn fetch_loop(pool: &Pool, index: usize, deliveries: &Sender<Delivery>, outcomes: &Sender<Outcome>) {
    let control = &*pool.control;
    let wake = &control.wake;
    let parts = pool.queue.partitions();
    let mut slot = ConnSlot::new();
    let mut cursor = index % parts;
    // One fetcher looks periodically, one partition per look, for what no wake-up
    // announces; the others wait for wake-ups, due times and the first one's finds.
    // Everything delayq writes announces itself or is a due time or lease deadline a
    // claim reports, so an idle pool looks rarely; the recipe's producers (the seed
    // layout) announce nothing, so there it looks at least every second.
    let look_every = match (index, &pool.queue.options().layout) {
        (0, Layout::Native) => Some(pool.opts.idle_check),
        (0, Layout::Seed { .. }) => Some(pool.opts.idle_check.min(SEED_LOOK)),
        _ => None,
    };
    // `stop_when_empty` asks Redis this often whether anything is left once its
    // handlers are done, however rarely the pool looks otherwise.
    let empty_check_every = pool.opts.idle_check.min(SEED_LOOK);
    let mut look_cursor = index % parts;
    let mut last_look = Instant::now();
    let mut next_empty_check = Instant::now();
    let mut error_pause = Duration::from_millis(50);
    loop {
        if control.stopped() {
            return;
        }
        if pool.stalled.load(Ordering::Acquire) {
            // The heartbeat clears the stall and kicks the fetchers.
            wake.wait(None, wake.epoch(), &control.stop);
            continue;
        }
        // Two statements: one lock at a time (`reserve_room` takes them the other way).
        let outstanding = pool.outstanding.lock().len();
        let held = outstanding + *pool.reserved.lock();
        let want = pool.opts.batch.min(pool.prefetch_now().saturating_sub(held));
        if want == 0 {
            // Enough work in hand: wait for a completion (local, no Redis call).
            control.slots.wait_for_release(Duration::from_millis(100));
            continue;
        }
        let now = Instant::now();
        let (part, share) = match wake.pick(cursor, now) {
            // Rotation alone is fair by claims, not by messages: room freed in bursts
            // would give one partition the big claims and the next the leftovers. An
            // equal share of the room per due partition keeps it fair by messages.
            (Pick::Claim { part, due }, _) => (part, want.div_ceil(due)),
            (Pick::Sleep(_), _) if look_every.is_some_and(|every| now >= last_look + every) => {
                let part = look_cursor;
                look_cursor = (look_cursor + 1) % parts;
                (part, want)
            }
            (Pick::Sleep(due), seen) => {
                let look = look_every.map(|every| last_look + every);
                let mut until = match (due, look) {
                    (Some(d), Some(l)) => Some(d.min(l)),
                    (d, l) => d.or(l),
                };
                if pool.opts.stop_when_empty && index == 0 {
                    if !pool.holds_nothing() {
                        // Handlers still run: look again soon (locally) to stop once
                        // the last one is done.
                        until = Some(until.map_or(now + EMPTY_POLL, |u| u.min(now + EMPTY_POLL)));
                    } else if now >= next_empty_check {
                        // Redis decides: a message due now that no wake-up announced
                        // (or that a pause or rate limit holds back) keeps the pool on.
                        next_empty_check = now + empty_check_every;
                        if pool.stop_if_empty() {
                            return;
                        }
                        wake.kick();
                        continue;
                    } else {
                        until = Some(until.map_or(next_empty_check, |u| u.min(next_empty_check)));
                    }
                }
                wake.wait(until, seen, &control.stop);
                continue;
            }
        };
        if pool.yields_to_higher() {
            // Local only: look again shortly, or at an announcement or a stop.
            wake.wait(Some(now + YIELD_RECHECK), wake.epoch(), &control.stop);
            continue;
        }
        if pool.waits_for_alone_turn(part) {
            control.slots.wait_for_release(Duration::from_millis(100));
            continue;
        }
        cursor = (part + 1) % parts;
        // Before this claim's own reservation, which would count against the free handler.
        let turn = pool.quarantine_turn();
        let reservation = pool.reserve_room(share, pool.is_rate_limited());
        let share = reservation.n;
        if share == 0 {
            drop(reservation);
            control.slots.wait_for_release(Duration::from_millis(100));
            continue;
        }
        let room = control.slots.acquire_up_to(share, &control.stop);
        if room == 0 {
            return;
        }
        let under_way = ClaimUnderWay::new(&pool.claiming);
        let started = Instant::now();
        last_look = started;
        wake.begin_claim(part, started);
        let (claimed, replied) = match claim(pool, &mut slot, part, room, turn.mode) {
            Ok(c) => c,
            Err(e) => {
                control.slots.release(room);
                // A permission taken away or a stray key: nothing was written, and only
                // an operator can mend it, so it is an error and the pool asks less often.
                let setup_fault = is_setup_fault(&e);
                let most = Duration::from_secs(if setup_fault { 30 } else { 2 });
                pool.note_claim_failed(part, e, started, setup_fault);
                pause_unless_stopped(pool, error_pause);
                error_pause = (error_pause * 2).min(most);
                wake.retry_claim(part);
                continue;
            }
        };
        error_pause = Duration::from_millis(50);
        pool.note_claim_went_through(part);
        wake.set_clock(started, replied, claimed.server_now_us);
        let paused = claimed.next_ms == PAUSED;
        pool.note_paused(paused);
        pool.rate_limited[part].store(claimed.rate_limited, Ordering::Relaxed);
        pool.quarantine_due[part].store(claimed.quarantined_left, Ordering::Relaxed);
        pool.note_restart_request(part, claimed.restart_generation);
        let got = claimed.items.len();
        control.slots.release(room - got);
        let first_ticket = take_tickets(got);
        let flags: Vec<CancelFlag> = (0..got).map(|_| CancelFlag::default()).collect();
        {
            let mut outstanding = pool.outstanding.lock();
            for ((ticket, item), flag) in (first_ticket..).zip(&claimed.items).zip(&flags) {
                outstanding.insert(
                    ticket,
                    Outstanding {
                        part,
                        lease: Arc::clone(&item.lease),
                        id: item.id.clone(),
                        claimed: replied,
                        started: None,
                        timed_out: false,
                        detached: false,
                        alone: item.lease.starts_with('q'),
                        renewed: started,
                        cancel: flag.clone(),
                    },
                );
            }
        }
        // The claimed deliveries count as held from here on.
        drop(reservation);
        drop(under_way);
        drop(turn);
        let occurrences: Vec<(String, i64)> = claimed
            .items
            .iter()
            .filter_map(|item| repeat::occurrence_of(&item.id).map(|(name, due)| (name.to_owned(), due)))
            .collect();
        hand_out(
            pool,
            part,
            claimed.server_now_ms,
            first_ticket,
            claimed.items.into_iter().zip(flags).collect(),
            deliveries,
            outcomes,
        );
        let next_ms = if paused { -1 } else { claimed.next_ms };
        if got == 0 && claimed.quarantined_left {
            // All that is due waits in the quarantine for a turn this pool cannot take
            // yet: look again once a delivery completes (see complete.rs), or shortly.
            wake.end_claim_not_before(part, next_ms, Instant::now() + QUARANTINE_RECHECK);
        } else {
            wake.end_claim(part, got == room, next_ms);
        }
        // After the hand-out, so that handlers need not wait for it.
        push_next_occurrences(pool, part, &occurrences, &claimed.broken_repeats);
    }
}

/// Keep repeating messages going: the occurrences just claimed get their successor
/// now, and repeats whose chain broke (see claim.lua) get theirs. A failure is logged
/// and retried at the partition's next check.
pub(super) fn push_next_occurrences(
    pool: &Pool,
    part: usize,
    occurrences: &[(String, i64)],
    broken: &[claim::BrokenRepeat],
) {
    let q = &pool.queue;
    let mut failed = false;
    for (name, due) in occurrences {
        let result = q.repeat_definitions(part, name).and_then(|found| match found.first() {
            Some(found) => q.push_next_occurrence(part, name, &found.definition, Some(*due)),
            // Stopped with unrepeat(): this occurrence was the last.
            None => Ok(false),
        });
        if let Err(e) = result {
            failed = true;
            log::warn!(
                "delayq[{}]: the next occurrence of repeat {name:?} could not be pushed: {e}; retrying soon",
                pool.queue_name
            );
        }
    }
    for claim::BrokenRepeat { name, definition, mark } in broken {
        match q.push_next_occurrence(part, name, definition, *mark) {
            Ok(_) => {}
            Err(e) => {
                failed = true;
                log::warn!(
                    "delayq[{}]: repeat {name:?} has no occurrence pending and its next could not be pushed: {e}",
                    pool.queue_name
                );
            }
        }
    }
    if failed {
        pool.recheck_repeats_soon(part);
    }
}

/// Pass claimed messages, held from `first_ticket` on, to the handlers; bury the
/// unreadable and the over-tried. Messages past their `expire_after` deadline (at
/// `server_now_ms`, the claim's reading of the Redis clock) are buried unrun.
pub(super) fn hand_out(
    pool: &Pool,
    part: usize,
    server_now_ms: i64,
    first_ticket: Ticket,
    items: Vec<(claim::Claimed, CancelFlag)>,
    deliveries: &Sender<Delivery>,
    outcomes: &Sender<Outcome>,
) {
    let layout = &pool.queue.options().layout;
    let max_payload = pool.opts.max_payload_bytes;
    let mut expired = 0;
    // Straight to the dead letters, without counting as a failed handler call.
    let bury = |id, token, ticket, error, past_max_attempts| {
        let _ = outcomes.send(Outcome::Nack {
            part,
            id,
            token,
            ticket,
            delay_ms: -1,
            error,
            trace: String::new(),
            counted: false,
            past_max_attempts,
        });
    };
    for (ticket, (item, cancel)) in (first_ticket..).zip(items) {
        let claim::Claimed {
            id,
            lease: token,
            score,
            attempt,
            envelope: stored,
            serial_key,
            group,
            unloaded,
        } = item;
        if let Some(size) = unloaded {
            log::error!(
                "delayq[{}]: message {id} of {size} bytes is past max_payload_bytes ({max_payload}), dead-lettered \
                 unread",
                pool.queue_name
            );
            bury(
                id,
                token,
                ticket,
                format!("message of {size} bytes is past this worker's max_payload_bytes ({max_payload}): not loaded"),
                false,
            );
            continue;
        }
        let due_at_ms = match score {
            // Never later than the claim: it was due (a stamp edited by hand may tell a
            // later time).
            Some(score) => layout.due_ms_of_score(score).min(server_now_ms),
            // No stamp (an envelope written by hand or by another tool): its due time
            // is unknown, and had come by the claim.
            None if matches!(layout, Layout::Native) && !envelope::has_stamp(&stored) => server_now_ms,
            None => {
                log::error!(
                    "delayq[{}]: message {id} has a malformed stamp, dead-lettered",
                    pool.queue_name
                );
                bury(
                    id,
                    token,
                    ticket,
                    "poison message: its stamp tells no due time".to_owned(),
                    false,
                );
                continue;
            }
        };
        let decoded = envelope::decode(layout, &stored);
        let max_attempts = decoded
            .as_ref()
            .ok()
            .and_then(|d| d.max_attempts)
            .unwrap_or(pool.opts.max_attempts);
        match decoded {
            Err(reason) => {
                log::error!(
                    "delayq[{}]: message {id} is unreadable, dead-lettered: {reason}",
                    pool.queue_name
                );
                bury(id, token, ticket, format!("poison message: {reason}"), false);
            }
            // Read (the claim read it, or it was within the room an envelope takes
            // beside its payload), yet no handler gets it: it will never fit.
            Ok(d) if d.payload_json.len() > max_payload => {
                log::error!(
                    "delayq[{}]: message {id} has a payload past max_payload_bytes ({max_payload}), dead-lettered",
                    pool.queue_name
                );
                bury(
                    id,
                    token,
                    ticket,
                    format!(
                        "payload of {} bytes is past this worker's max_payload_bytes ({max_payload})",
                        d.payload_json.len()
                    ),
                    false,
                );
            }
            // Its earlier deliveries failed or ended with an expired lease (the worker
            // died or hung), or this pool allows fewer than the one before: running it
            // again would exceed the limit. The last error stays in the dead letter.
            Ok(_) if attempt > max_attempts => {
                log::warn!(
                    "delayq[{}]: message {id} moved to the dead-letter set: {} deliveries ended unfinished, \
                     max_attempts is {max_attempts}",
                    pool.queue_name,
                    attempt - 1
                );
                bury(
                    id,
                    token,
                    ticket,
                    format!("gave up after {} attempts (max_attempts {max_attempts})", attempt - 1),
                    true,
                );
            }
            Ok(d) if d.expiry.is_some_and(|(_, deadline)| server_now_ms > deadline) => {
                let (after_ms, deadline) = d.expiry.unwrap_or_default();
                expired += 1;
                bury(
                    id,
                    token,
                    ticket,
                    format!(
                        "expired: not started within {} of its due time (expire_after); the deadline passed {} ago",
                        crate::time::human_ms(i64::try_from(after_ms).unwrap_or(i64::MAX)),
                        crate::time::human_ms(server_now_ms - deadline)
                    ),
                    false,
                );
            }
            Ok(d) => {
                let payload = d.payload_span(&stored);
                let _ = deliveries.send(Delivery {
                    id,
                    attempt,
                    due_at_ms,
                    queue: Arc::clone(&pool.queue_name),
                    max_attempts,
                    expires_at_ms: d.expiry.map(|(_, deadline)| deadline),
                    serial_key,
                    group,
                    stored,
                    payload,
                    token,
                    part,
                    ticket,
                    member: pool.member,
                    handed_out: None,
                    cancel,
                });
            }
        }
    }
    if expired > 0 {
        // One line per claim: after an outage, thousands may expire at once.
        log::warn!(
            "delayq[{}]: {expired} message(s) passed their expire_after deadline before they could start; \
             moved to the dead-letter set unrun",
            pool.queue_name
        );
    }
}
