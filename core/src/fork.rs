//! Fork detection and message ids without a system call per push.
//!
//! glibc's `getpid()` is a real system call (its cache went in 2.25), and so is the
//! `getrandom` behind `Uuid::now_v7()`: two of them per push cost more than the
//! push's Lua on a virtual machine. A `pthread_atfork` child handler counts forks
//! instead, and ids draw from a per-thread generator that is seeded from the OS once
//! and again in every forked child, where it would otherwise repeat the parent's
//! sequence (and two processes would make the same ids, which an idempotent push
//! would silently merge).

use std::cell::RefCell;
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

static FORKS: AtomicU64 = AtomicU64::new(0);
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

thread_local! {
    static IDS: RefCell<Option<(u64, StdRng)>> = const { RefCell::new(None) };
}

/// A new UUID v7 (time-ordered to the millisecond, 74 random bits) as text.
pub(crate) fn new_message_id() -> String {
    let now = crate::time::now_unix_ms();
    let mut random = [0u8; 10];
    let forks = generation();
    IDS.with_borrow_mut(|slot| {
        let rng = match slot {
            Some((seen, rng)) if *seen == forks => rng,
            _ => &mut slot.insert((forks, StdRng::from_os_rng())).1,
        };
        rng.fill_bytes(&mut random);
    });
    uuid::Builder::from_unix_timestamp_millis(u64::try_from(now).unwrap_or(0), &random)
        .into_uuid()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_v7_and_distinct() {
        let a = new_message_id();
        let b = new_message_id();
        assert_ne!(a, b);
        let parsed = uuid::Uuid::parse_str(&a).expect("a uuid");
        assert_eq!(parsed.get_version_num(), 7);
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
            // parent's next one (the 48-bit time prefix may differ by a millisecond).
            let parent_id = new_message_id();
            assert_ne!(
                child_id[14..],
                parent_id[14..],
                "the child repeats the parent's sequence"
            );
        }
    }
}
