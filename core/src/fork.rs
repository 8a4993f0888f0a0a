//! Fork detection and message ids without a system call per push.
//!
//! glibc's `getpid()` is a real system call (its cache went in 2.25), and so is the
//! `getrandom` behind `Uuid::now_v7()`: two of them per push cost more than the
//! push's Lua on a virtual machine. A `pthread_atfork` child handler counts forks
//! instead, and ids draw from a per-thread generator that is seeded from the OS once
//! and again in every forked child, where it would otherwise repeat the parent's
//! sequence (and two processes would make the same ids, which an idempotent push
//! would silently merge).
//!
//! Ids sort in the order they were made in one process, as `Uuid::now_v7()`'s do:
//! the 12 bits after the version and the next 10 hold a counter within the
//! millisecond, and the last 52 bits are random (they tell processes apart). The
//! recipe's consumers, which order equal whole-second scores by member, rely on it.

use std::cell::RefCell;
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

static FORKS: AtomicU64 = AtomicU64::new(0);
/// The last id's `unix_ms << COUNTER_BITS | counter`, shared by all threads.
static LAST: AtomicU64 = AtomicU64::new(0);
const COUNTER_BITS: u32 = 22;
static WATCH: Once = Once::new();

extern "C" fn count_fork_in_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// Changes in a child process after every `fork()` (PHP's `pcntl_fork`, Python's
/// `os.fork`, the PHP supervisor). Compare two readings to learn whether this is
/// still the process that took the first one.
pub(crate) fn generation() -> u64 {
    WATCH.call_once(|| {
        // SAFETY: registers a plain function that touches only an atomic, which is
        // async-signal-safe as a fork child handler must be.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(count_fork_in_child)) };
        assert_eq!(rc, 0, "pthread_atfork failed");
    });
    FORKS.load(Ordering::Relaxed)
}

/// Ends this process at once with `status`: `_exit`, so that no destructor, atexit
/// hook or flush runs, for a child forked from a process whose pool's threads (and
/// the locks they held at the fork) did not come along.
pub(crate) fn exit_child(status: i32) -> ! {
    // SAFETY: _exit(2) ends the process; it touches no state of ours.
    unsafe { libc::_exit(status) }
}

thread_local! {
    static IDS: RefCell<Option<(u64, StdRng)>> = const { RefCell::new(None) };
}

/// A new UUID v7 as text: greater than every id this process made before.
pub(crate) fn new_message_id() -> String {
    let now = u64::try_from(crate::time::now_unix_ms()).unwrap_or(0);
    // Within one millisecond the counter goes up; past 4 million ids in one
    // millisecond it borrows the next one, and a clock stepping back changes nothing.
    let mut last = LAST.load(Ordering::Relaxed);
    let stamp = loop {
        let next = (now << COUNTER_BITS).max(last + 1);
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break next,
            Err(seen) => last = seen,
        }
    };
    let (ms, counter) = (stamp >> COUNTER_BITS, stamp & ((1 << COUNTER_BITS) - 1));
    let forks = generation();
    let random = IDS.with_borrow_mut(|slot| {
        let rng = match slot {
            Some((seen, rng)) if *seen == forks => rng,
            _ => &mut slot.insert((forks, StdRng::from_os_rng())).1,
        };
        rng.next_u64() >> 12
    });
    let rand_a = u128::from(counter >> 10);
    let rand_b = (u128::from(counter & 0x3ff) << 52) | u128::from(random);
    let bits = (u128::from(ms) << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b;
    uuid::Uuid::from_u128(bits).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_v7_and_sort_in_the_order_they_were_made() {
        let ids: Vec<String> = (0..20_000).map(|_| new_message_id()).collect();
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
        }
        let parsed = uuid::Uuid::parse_str(&ids[0]).expect("a uuid");
        assert_eq!(parsed.get_version_num(), 7);
        assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
        let (secs, _) = parsed.get_timestamp().expect("v7 has a time").to_unix();
        let now = crate::time::now_unix_ms() / 1000;
        assert!(
            secs.abs_diff(u64::try_from(now).expect("positive")) <= 5,
            "{secs} vs {now}"
        );
    }

    #[test]
    fn threads_make_distinct_ids() {
        let all: std::collections::HashSet<String> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..5_000).map(|_| new_message_id()).collect::<Vec<_>>()))
                .collect();
            hs.into_iter().flat_map(|h| h.join().expect("thread")).collect()
        });
        assert_eq!(all.len(), 20_000);
    }

    #[test]
    fn a_forked_child_sees_a_new_generation_and_makes_other_ids() {
        let before = generation();
        // Seed this thread's generator before the fork, so the child inherits it.
        new_message_id();
        let mut pipe = [0i32; 2];
        // SAFETY: plain pipe/fork/write/_exit; the child calls only our code and exits.
        unsafe {
            assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0);
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                let line = format!("{} {}\n", generation(), new_message_id());
                libc::write(pipe[1], line.as_ptr().cast(), line.len());
                libc::_exit(0);
            }
            libc::close(pipe[1]);
            let mut buf = [0u8; 128];
            let n = libc::read(pipe[0], buf.as_mut_ptr().cast(), buf.len());
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            let text = String::from_utf8_lossy(&buf[..usize::try_from(n).unwrap_or(0)]).into_owned();
            let (generation_in_child, child_id) = text.trim().split_once(' ').expect("child wrote a line");
            assert_eq!(generation_in_child.parse::<u64>().expect("number"), before + 1);
            assert_eq!(generation(), before, "the parent is still the same process");
            // Without a reseed the child's first id would carry the random bits of the
            // parent's next one: its last group, 48 of the 52 random bits.
            let parent_id = new_message_id();
            assert_ne!(
                child_id[24..],
                parent_id[24..],
                "the child repeats the parent's sequence"
            );
        }
    }
}
