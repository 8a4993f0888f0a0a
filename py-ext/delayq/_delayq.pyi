"""The compiled part of delayq (Rust, pyo3). Import from ``delayq``, not from here."""

from datetime import datetime
from os import PathLike
from typing import Any, Iterable, Mapping, Optional, Union, final

from .records import DeadLetter, MessageInfo, Minute, RateLimit, RegisteredQueue, Repeat, Stats, Summary, WorkerInfo

__all__ = ["DelayQueue", "Message", "_Worker", "_Consumer", "_Delivery", "_Scaler", "_Slot", "_SlotTable", "_StopSignals", "_Supervisor",
           "__version__", "DEFAULT_MAX_PAYLOAD_BYTES", "WORKER_OPTIONS", "QUEUE_OPTIONS", "RECORD_SHAPES",
           "_URGENT_AFTER", "_CANCEL_GRACE", "_COROUTINE_GRACE", "_cancel_error", "_report_done", "_report_hook_failed", "_stop_with_supervisor"]

__version__: str
DEFAULT_MAX_PAYLOAD_BYTES: int
# The worker options table: name, kind, min, max, above_zero, default, php, python, doc.
WORKER_OPTIONS: tuple[dict[str, Any], ...]
# The queue options table, in the same form (and choices: the values a text may take).
QUEUE_OPTIONS: tuple[dict[str, Any], ...]
# Each record of delayq.records by name, with its fields in order (the core's, as PHP's).
RECORD_SHAPES: dict[str, tuple[str, ...]]

def _cancel_error(timeout: float) -> str: ...
def _report_done(summary: Mapping[str, Any]) -> str: ...
def _report_hook_failed(hook: str, what: str) -> str: ...
def _stop_with_supervisor(parent: int) -> None: ...

@final
class DelayQueue:
    """A delay queue on Redis. Usable on both sides of ``os.fork()``: each process opens
    its own connection.

    ``url``: ``redis://[user:password@]host:port[/db]``, ``rediss://`` for TLS (with
    ``tls_ca_file`` for a private CA), ``redis+cluster://host1:port1,host2:port2``,
    ``redis+sentinel://host1:26379,host2:26379/mymaster[/db]`` behind Redis Sentinel.
    With ``layout="seed"`` the queue uses the hand-made recipe's keys
    (``delay_queue:zset`` and ``delay_queue:payload`` unless ``zset_key`` and
    ``payload_key`` say otherwise). Timeouts are seconds.

    ``partitions`` spreads one queue over that many hash tags, one per Redis Cluster
    master (changing it moves the queue to other keys: drain it first).
    ``wait_replicas`` makes every push wait until that many replicas confirm it (Redis
    ``WAIT``, at most ``wait_timeout`` seconds); fewer raise TimeoutError.
    ``keep_completed=N`` keeps the latest N acknowledged messages (none by default)
    for ``keep_completed_for`` seconds, for ``get()`` and ``completed()`` to show
    ("did order 10086 close, and when?"); the workers apply it as they acknowledge.
    """

    def __new__(
        cls,
        url: str = "redis://127.0.0.1:6379",
        queue: str = "default",
        *,
        prefix: str = "dq",
        layout: str = "native",
        zset_key: Optional[str] = None,
        payload_key: Optional[str] = None,
        max_payload_bytes: int = 1048576,
        connect_timeout: float = 2.0,
        read_timeout: float = 5.0,
        retry_timeout: float = 5.0,
        tls_ca_file: Optional[Union[str, PathLike[str]]] = None,
        partitions: int = 1,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
        dead_max: int = 10000,
        dead_ttl: float = 2592000.0,
        keep_completed: int = 0,
        keep_completed_for: float = 86400.0,
    ) -> DelayQueue: ...
    def sharing_connection(
        self,
        queue: str,
        *,
        prefix: Optional[str] = None,
        layout: str = "native",
        zset_key: Optional[str] = None,
        payload_key: Optional[str] = None,
        max_payload_bytes: int = 1048576,
        partitions: int = 1,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
        dead_max: int = 10000,
        dead_ttl: float = 2592000.0,
        keep_completed: int = 0,
        keep_completed_for: float = 86400.0,
    ) -> DelayQueue:
        """The queue ``queue`` on this queue's Redis that shares this queue's connection:
        many queues, one client of Redis (a dashboard of hundreds of queues). Takes the
        options of ``DelayQueue()`` with their defaults, but ``prefix`` defaults to this
        queue's, and those of the connection (``url``, timeouts, ``tls_ca_file``) are
        this queue's. The calls of queues that share a connection take turns on it; a
        ``Worker`` built on one opens its own. The connection reconnects as any does,
        for all of them, and after ``os.fork()`` each process opens its own."""
    @property
    def name(self) -> str:
        """The queue's name."""
    def push(
        self,
        payload: Any,
        delay: float = 0.0,
        *,
        id: Optional[str] = None,
        max_attempts: Optional[int] = None,
        partition_key: Optional[str] = None,
        replace: bool = False,
        expire_after: Optional[float] = None,
        serial_key: Optional[str] = None,
        group: Optional[str] = None,
    ) -> str:
        """Schedule ``payload`` (any JSON value) after ``delay`` seconds on the Redis
        server's clock; returns the message id. An ``id`` makes the push idempotent:
        a message of that id is kept as it is, or, with ``replace=True``, replaced
        (payload and due time, attempts and last error reset) while it waits or is
        dead; a running one is left alone. ``replace`` debounces: "close the cart 30
        minutes after its last change". On a partitioned queue, messages with the same
        ``partition_key`` share a partition (claimed in due-time order); otherwise the
        id picks one. With ``expire_after`` (seconds), a message that cannot start that
        long after its due time goes to the dead-letter set unrun, its error saying so
        (retries keep the deadline, ``reschedule`` moves it, ``requeue_dead`` renews it;
        not in the seed layout). Messages with the same ``serial_key`` (say
        ``"order:10086"``) never run at the same time and start in due order: while one
        runs, the next waits and starts as soon as it ends (a failure frees the key, so
        its retry may come after a later message of the key; the key also picks the
        partition; not in the seed layout). A message's ``group`` (say
        ``"merchant-42"``) counts against that group's limits (``set_group_limit``):
        beyond them its messages wait in the group's line while other groups go on (a
        serial key is a group of limit 1, so a message takes one or the other; the group
        picks the partition; not in the seed layout).

        Raises TypeError for a value that is not JSON, ValueError (or
        InvalidArgumentError) for NaN, negative or infinite delays, PayloadError when
        the JSON is over ``max_payload_bytes``."""
    def push_at(
        self,
        payload: Any,
        at: Union[float, datetime],
        *,
        id: Optional[str] = None,
        max_attempts: Optional[int] = None,
        partition_key: Optional[str] = None,
        replace: bool = False,
        expire_after: Optional[float] = None,
        serial_key: Optional[str] = None,
        group: Optional[str] = None,
    ) -> str:
        """Schedule ``payload`` at ``at``: Unix seconds or a datetime. A naive datetime
        (no ``tzinfo``) is this process's local time, as ``datetime.timestamp()`` reads
        it; give an aware one (``tzinfo=timezone.utc``) when producers' time zones may
        differ."""
    def push_many(self, items: Iterable[Union[tuple[Any, float], Mapping[str, Any]]]) -> list[str]:
        """Schedule many messages in one round trip (two for 1 000 delays or more, the first
        reading the Redis clock so that the client stamps them): ``(payload, delay)`` tuples or dicts
        with ``payload`` and optional ``delay`` or ``at``, ``id``, ``max_attempts``,
        ``partition_key``, ``replace``, ``expire_after``, ``serial_key``, ``group``. Nothing is written unless every
        item is valid. Up to 1 000 messages of one partition are one script, written all or none,
        and its error is the one a push raises. A batch of several scripts (more messages, or
        several partitions) that fails in one may have written others: then it raises a
        ``PartialPushError`` whose ``written_ids``, ``unknown_ids`` and ``ids`` say what was
        written, what may have been (a connection lost before the reply) and every id of the
        batch; it is also the class its cause raises (``OutOfMemoryError`` for a full Redis)."""
    def cancel(self, id: str, *, kill: bool = False) -> bool:
        """Cancel a message. One that waits is deleted. One that runs is marked
        cancelled: its worker learns of it within a heartbeat (a third of its lease),
        its handler sees ``message.cancelled`` (an asyncio handler's task is
        cancelled), and whatever the handler does then, the message is deleted: not
        retried, not dead-lettered, counted as ``cancelled`` in ``stats()``. With
        ``kill=True``, a supervised worker process (``processes``) that runs it is
        killed as at its ``timeout``. False when it is unknown or dead."""
    def reschedule(self, id: str, delay: float) -> bool:
        """Move a waiting message to ``delay`` seconds from now; False when not waiting."""
    def get(self, id: str) -> Optional[MessageInfo]:
        """``{id, state, payload, payload_omitted_bytes, due_at, attempts, max_attempts,
        last_error, error_trace, dead_at, created_at, lease_until, expires_at,
        completed_at, serial_key, group, held, cancelled}``, or
        None for an unknown id. ``state`` is scheduled, ready, inflight, dead or
        completed (kept by ``keep_completed``, acknowledged at ``completed_at``);
        ``attempts`` counts deliveries so far, the running one included; ``lease_until``
        is set while it runs: when its lease ends unless the heartbeat extends it;
        ``expires_at`` (with ``expire_after``) is the latest it may start;
        ``error_trace``, beside ``last_error`` when the failure came with one, is the
        handler's traceback (a PHP worker's exception with its stack trace), cut to the
        worker's ``max_trace_bytes``. ``get()`` shows payload, error and trace whole,
        however large; the listings (``waiting``, ``inflight``, ``completed``, ``find``,
        ``find_field``, ``dead_letters``) show a stored message larger than 64 KiB as
        ``payload`` None and ``payload_omitted_bytes`` its stored size (payload and
        metadata; ``max_attempts``, ``created_at`` and ``expires_at`` are then None),
        never read, and cut an error past 4096 bytes and a trace past 16 KiB to their start
        and end around a note: a producer that writes huge payloads cannot make them too
        slow to show its queue. ``payload_omitted_bytes`` is None when the payload is there.
        ``cancelled`` is True for a running message that ``cancel()`` marked: its
        delivery ends as cancelled whatever its handler does (a listing that left the
        payload out shows False). ``group`` is the push's ``group``; ``held`` (None in the
        listings of running and completed messages) says why a due message waits in its serial
        key's or group's line, e.g. ``'group "merchant-42" runs 3 of its concurrency
        limit of 3'``."""
    def waiting(self, limit: int = 100, *, start: int = 0) -> list[MessageInfo]:
        """The next ``limit`` (at most 1000) messages waiting, scheduled or ready,
        earliest due first, from every partition, each as ``get()`` shows it, after
        skipping ``start`` (at most 100 000: a page). A snapshot for looking at a queue,
        not for consuming it."""
    def inflight(self, limit: int = 100, *, start: int = 0) -> list[MessageInfo]:
        """Up to ``limit`` (at most 1000) running messages, earliest lease deadline
        first, each as ``get()`` shows it; a ``lease_until`` in the past is a delivery
        whose worker died or hung (the next claim gives it to another worker)."""
    def find(self, text: str, limit: int = 20) -> list[MessageInfo]:
        """Up to ``limit`` (at most 1000) messages whose payload contains ``text`` (or whose id it is)
        (plain text, not a pattern), in any state: waiting, running, dead, or completed
        and kept, each as ``get()`` shows it; for an operator with an order number and a
        generated message id. It scans the whole queue on the server, 1000 entries a
        step (Redis is never blocked for long), so its cost grows with the queue: not
        for request paths. Messages written or deleted during the scan may be missed."""
    def find_field(
        self, field: str, value: Union[str, int, float, bool, None], limit: int = 20
    ) -> list[MessageInfo]:
        """Up to ``limit`` (at most 1000) messages whose payload is a dict with ``field``
        equal to ``value``, in any state, as ``find()`` shows them: for an order number
        that is also part of other numbers (``find("10086")`` also returns order
        100861). The comparison is exact, type included: ``10086`` is not ``"10086"``.
        It scans as ``find()`` does."""
    def completed(self, limit: int = 100, *, start: int = 0) -> list[MessageInfo]:
        """Up to ``limit`` (at most 1000) completed messages kept by ``keep_completed``,
        latest first, from every partition, each as ``get()`` shows it: ``due_at`` of
        the delivery that completed it, ``attempts`` it took, ``completed_at``."""
    def stats(self) -> Stats:
        """Depth (scheduled, ready, inflight, dead, completed, held, next_due_at, paused_at, rate_limit), summed
        over the ``partitions``, and lifetime counters
        (pushed, delivered, acked, retried, died, expired, released, cancelled, requeued,
        discarded, trimmed, purged, replaced, moved). ``held`` counts the scheduled
        messages, due already, that wait in their serial key's or group's line (``get()``
        says why)."""
    def dead_letters(self, limit: int = 100, *, start: int = 0) -> list[DeadLetter]:
        """Up to ``limit`` dead letters, newest first, after skipping the ``start``
        newest (as ``waiting``): ``{id, payload, payload_omitted_bytes, attempts,
        last_error, error_trace, dead_at}``, payloads, errors and traces bounded as the
        listings bound them (see ``get``)."""
    def workers(self) -> list[WorkerInfo]:
        """The consumer pools alive on this queue, from every host and language, oldest
        first: ``{id, host, pid, started_at, last_seen, threads, handlers, handled,
        acked, failed, holding, started_recently, lateness_avg, lateness_max,
        handler_avg}``. A pool renews its entry every ``lease / 3`` (and, while it works,
        every second, so its counts are at most about 2 s old) and drops out after
        three missed renewals. Each renewal reports the handlers started since the one
        before and how late they started after their due time (seconds, server clock;
        None when none started), and the moving average of one handler call (seconds;
        None until measured)."""
    def minutes(self, span: int = 60) -> list[Minute]:
        """The last ``span`` minutes (1 to 90) of the queue, oldest first, the current one
        last, summed over the ``partitions``: ``{at, handled, failed, lateness_p50,
        lateness_p99, scheduled, ready, inflight}``. ``at`` is when the minute began
        (seconds, server clock); ``handled`` the handlers started in it and ``failed``
        the handler calls that failed; ``lateness_p50`` and ``lateness_p99`` how late
        handlers started after their due time (seconds, within about 9 %; None when
        none started). The backlog (``scheduled``, ``ready``, ``inflight``) is sampled
        once a minute by the first pool that reports in it; None when none did. Consumer
        pools of any language write these at their heartbeat; they are kept 90 minutes."""
    def registered_queues(self) -> list[RegisteredQueue]:
        """The queues on this Redis under this queue's ``prefix`` that a consumer pool or
        producer registered, by name: ``{name, layout, zset_key, payload_key,
        partitions, last_seen}``, enough to open each (``zset_key`` and ``payload_key``
        only for the seed layout). A pool registers its queue when it starts and hourly,
        a producer once per process at its first push; entries unseen for a week are
        left out. What lists queues without being told their names (``delayq
        dashboard``); a user whose ACL rule covers only its queue's keys registers
        nothing. Reads the whole registry: ``registered_queues_page`` reads a part."""
    def registered_queues_page(self, limit: int = 50, *, start: int = 0) -> tuple[list[RegisteredQueue], int]:
        """Entries ``start`` to ``start + limit`` (at most 1000) of the registry that
        ``registered_queues`` reads, the most recently seen first, and how many entries
        it holds: one bounded read however many others wrote to it. A name is on a page
        once (its latest entry there); an entry that does not parse is left out, so a
        page may hold fewer. The next page starts at ``start + limit``."""
    def requeue_dead(self, id: Optional[str] = None) -> int:
        """Send dead letters back, due now, with a fresh attempt budget: one, or all when
        ``id`` is None. Returns how many."""
    def delete_dead(self, id: Optional[str] = None) -> int:
        """Delete dead letters for good, payload and all: one, or all when ``id`` is
        None. Returns how many; waiting and running messages are not touched."""
    def requeue_dead_with_error(self, text: str) -> int:
        """Send back the dead letters whose last error contains ``text`` (plain text,
        not a pattern), as ``requeue_dead`` does each: after the fix of one failure, the
        others stay dead. Reads the errors of the whole dead-letter set on the server,
        1000 a call. Returns how many."""
    def delete_dead_with_error(self, text: str) -> int:
        """Delete the dead letters whose last error contains ``text`` (plain text), as
        ``delete_dead`` does each. Returns how many."""
    def repeat(
        self,
        name: str,
        schedule: Union[str, float],
        payload: Any,
        *,
        tz: Optional[str] = None,
        max_attempts: Optional[int] = None,
        expire_after: Optional[float] = None,
    ) -> float:
        """Define or change a repeating message: ``payload`` is pushed once per occurrence
        of ``schedule`` (a cron pattern such as ``"0 2 * * *"``, 6 fields with seconds
        first, read in the IANA zone ``tz``, UTC by default; or an interval in seconds,
        at least 1) as a message with the id ``repeat:<name>:<due ms>``. Each occurrence
        runs once however many workers there are; ones missed while none ran are
        skipped. The same definition again changes nothing; another replaces it and its
        waiting occurrence. With ``expire_after`` (seconds) an occurrence that cannot
        start that long after its due time, say after an outage, goes to the dead-letter
        set unrun and the next one is due as usual. Returns the next occurrence's due
        time (Unix seconds)."""
    def unrepeat(self, name: str) -> bool:
        """Stop a repeating message; its waiting occurrence is cancelled. False if there
        was none of that name."""
    def repeats(self) -> list[Repeat]:
        """The repeating messages by name: ``{name, schedule, tz, payload, max_attempts,
        expire_after, next_due_at}``; ``schedule`` is the pattern, or the interval in
        seconds."""
    def pause(self) -> bool:
        """Stop consumption for every worker pool, on every host and in every language,
        until ``resume()``: no handler starts a new message beyond what a pool had
        prefetched (about 50 ms of work per handler); running handlers finish as usual,
        pushes are still accepted. Stored in Redis: it survives worker restarts and
        ``purge()``. False if the queue was paused already."""
    def resume(self) -> bool:
        """Undo ``pause()``; idle worker pools are woken at once. False if the queue was
        not paused."""
    def is_paused(self) -> bool:
        """Whether ``pause()`` is in force (``stats()["paused_at"]`` says since when)."""
    def set_rate_limit(self, max: int, per: float = 1.0) -> None:
        """Hand out at most ``max`` messages in any window of ``per`` seconds (sliding,
        not aligned to the clock), over every worker pool on every host and in every
        language, retries and re-deliveries included: e.g. to stay within a payment
        provider's quota. Stored in Redis until changed or cleared; pools follow it from
        their next claim and sleep until the window has room, and take one message per
        idle handler (no prefetch), so a message starts as it is handed out. A partitioned queue
        splits ``max`` among its partitions, so it must be at least their count.
        ``InvalidArgumentError`` (a ``ValueError``) for ``max`` below 1, ``per`` outside
        0.001 to 2678400 (31 days); nothing is written."""
    def clear_rate_limit(self) -> bool:
        """Lift the rate limit; pools it held back start at once. False if none was set."""
    def set_group_limit(
        self,
        group: Optional[str],
        *,
        concurrency: Optional[int] = None,
        max: Optional[int] = None,
        per: Optional[float] = None,
    ) -> bool:
        """Limit ``group``'s messages, or with None the default of every group without
        limits of its own: at most ``concurrency`` of them run at once, and at most
        ``max`` start in any window of ``per`` seconds (1 unless given), over every
        worker pool on every host and in every language. A group's messages beyond its
        limits wait in its line, in due order, while other groups go on. Stored in Redis
        until changed: a raised limit starts held messages at once; a lowered one stops
        none that runs. Without ``concurrency`` and ``max``, clears the limits (a group's
        own: the default applies to it again). Not in the seed layout. Returns whether
        limits were in force before. ``InvalidArgumentError`` (a ``ValueError``) for a
        bad group, ``concurrency`` or ``max`` below 1, ``per`` outside 0.001 to 2678400
        (31 days) or without ``max``; nothing is written."""
    def rate_limit(self) -> Optional[RateLimit]:
        """The rate limit in force, ``{"max": int, "per": float}``, or None (also
        ``stats()["rate_limit"]``)."""
    def restart_workers(self) -> int:
        """Ask every worker pool running on this queue, on every host and in every
        language, to stop gracefully, as Laravel's ``queue:restart`` does: after a
        deploy, so that the process manager starts the new code. Each pool finishes its
        running handlers, releases what it had prefetched, and ``Worker.run`` returns
        with ``stopped_by`` ``"restart"``. Idle pools are woken at once; workers made
        after the request are not affected. Returns how many pools were alive when
        asked."""
    def acl_rule(self, user: str, *, preloaded_scripts: bool = False, functions: bool = False) -> str:
        """The ``ACL SETUSER`` line that grants ``user`` exactly this queue: each
        partition's keys, its wake-up channels and the commands delayq sends, e.g.
        ``ACL SETUSER app on >PASSWORD resetkeys ~{dq:orders}:* resetchannels
        &{dq:orders}:wake -@all +evalsha ...``. Replace ``PASSWORD`` with the user's
        password before running it. It grants ``SCRIPT LOAD``, with which the user may
        load and run any Lua (under the same ACL); with ``preloaded_scripts``, it does
        not, and an admin loads delayq's scripts (``load_scripts``) after each restart,
        failover or ``SCRIPT FLUSH``. With ``functions`` (Redis 7.0+), it grants FCALL
        instead of EVALSHA and ``SCRIPT LOAD``: the user runs no Lua but the functions
        an admin installed (``install_functions``). Raises InvalidArgumentError for an
        empty ``user``, or both ``preloaded_scripts`` and ``functions``."""
    def load_scripts(self) -> int:
        """Load every script of delayq on the server (each node of a cluster), as an
        admin, for users whose rule lacks ``SCRIPT LOAD``
        (``acl_rule(user, preloaded_scripts=True)``). Returns how many."""
    def install_functions(self) -> str:
        """Install this build's library of functions (``FUNCTION LOAD REPLACE``, each
        master of a cluster; Redis 7.0+), as an admin, for users whose rule grants
        FCALL (``acl_rule(user, functions=True)``). Once per build: Redis keeps
        functions across restarts and replicates them. Connections made after it
        call the functions. Returns the library's name (``delayq_`` and a hash of
        this build's scripts: each build's library stands beside the others)."""
    def move_waiting(self, to: DelayQueue) -> int:
        """Move every waiting message (scheduled or due, not yet claimed) to the queue
        ``to``, which may differ in name, layout, partitions or Redis: the last step of
        leaving the seed layout, once every consumer runs delayq. Each keeps its id,
        payload, due time, ``max_attempts`` and ``expire_after`` deadline; attempts and
        last error start afresh. Running messages finish where they are; dead letters
        stay (``requeue_dead()`` them first to move them). A message whose id ``to``
        holds already is kept there as it is. Batches of up to 1000 are pushed to
        ``to`` before they are deleted here, so an error or a crash loses nothing: move
        again. A message that ``to`` cannot hold (an ``expire_after`` for the seed
        layout, a payload that is no JSON) raises ``InvalidArgumentError`` naming it,
        with its batch unwritten. Returns how many were moved."""
    def purge(self) -> int:
        """Delete every message in every state; returns how many. A message that a
        worker holds already (running, or prefetched in its memory) may still reach its
        handler: stop the workers first to run nothing more."""
    def ping(self) -> bool:
        """Check that Redis answers; raises ConnectionError otherwise."""

@final
class Message:
    """One delivery, the handler's second argument."""

    @property
    def id(self) -> str:
        """The message id."""
    @property
    def attempt(self) -> int:
        """This delivery's number, counting from 1."""
    @property
    def max_attempts(self) -> int:
        """Deliveries allowed before the message goes to the dead-letter set."""
    @property
    def due_at(self) -> float:
        """When this delivery was due: Unix time in seconds."""
    @property
    def expires_at(self) -> Optional[float]:
        """With ``expire_after``: the latest it could start, Unix seconds; else None."""
    @property
    def serial_key(self) -> Optional[str]:
        """With ``serial_key``: the key, which no other running message holds
        meanwhile; else None."""
    @property
    def group(self) -> Optional[str]:
        """With ``group``: the group, whose limits it counts against; else None."""
    @property
    def queue(self) -> str:
        """The queue's name."""
    @property
    def partition(self) -> int:
        """The partition it came from (0 unless the queue has ``partitions``)."""
    @property
    def cancelled(self) -> bool:
        """Whether it was cancelled while it runs (``DelayQueue.cancel`` from any
        process), as its worker learned within a heartbeat. Whatever the handler does
        then, the message is deleted: not retried, not dead-lettered."""
    def retry_later(self, delay: float, reason: str = "retry requested by the handler") -> None:
        """Fail this delivery and run it again after ``delay`` seconds (a rate limit's
        "try again in 60 s"), whatever the handler does next. Counts as an attempt:
        past max_attempts the message goes to the dead-letter set."""
    def dead_letter(self, reason: str = "dead-lettered by the handler") -> None:
        """Fail this delivery for good: to the dead-letter set now with ``reason``, no
        retries, whatever the handler does next."""

@final
class _Delivery:
    @property
    def payload(self) -> Any: ...
    @property
    def message(self) -> Message: ...

@final
class _Consumer:
    def recv(self, timeout: float) -> Optional[_Delivery]: ...
    @property
    def stopped(self) -> bool: ...
    def settle(
        self, delivery: _Delivery, raised: Optional[BaseException] = None
    ) -> tuple[Optional[BaseException], bool, Optional[str]]: ...
    def release(self, delivery: _Delivery) -> None: ...
    def begin(self, delivery: _Delivery) -> bool: ...
    def after_job(self) -> None: ...
    def stop(self) -> None: ...
    def finish(self, stopped_by: Optional[str]) -> Summary: ...

@final
class _Worker:
    def __new__(
        cls,
        queue: DelayQueue,
        *,
        threads: int,
        batch: int,
        prefetch: int,
        lease: float,
        max_attempts: int,
        backoff_base: float,
        backoff_max: float,
        timeout: Optional[float],
        idle_check: float,
        stop_when_empty: bool,
        lower_queues: list[DelayQueue],
        max_trace_bytes: int = 8192,
        max_payload_bytes: int = 1048576,
        no_retry: Optional[tuple[type[BaseException], ...]] = None,
        max_jobs: Optional[int] = None,
        max_time: Optional[float] = None,
        max_memory_mb: Optional[int] = None,
    ) -> _Worker: ...
    def run(self, handler: Any, on_dead: Any = None, on_failure: Any = None,
            slot: Optional[_Slot] = None) -> Summary: ...
    def start(self, handlers: int, slot: Optional[_Slot] = None) -> _Consumer: ...
    def take_stop_reason(self) -> Optional[str]: ...
    def stop(self, reason: str = "stop") -> None: ...

@final
class _Scaler:
    def __new__(cls, min: int, max: int, cooldown: float) -> _Scaler: ...
    @property
    def initial(self) -> int: ...
    @property
    def min(self) -> int: ...
    @property
    def is_auto(self) -> bool: ...
    def look(self, queues: list[DelayQueue], running: int, busy: int) -> int: ...

@final
class _Slot:
    def __new__(cls, path: str, index: int) -> _Slot: ...
    def started(self, delivery: Optional[_Delivery], grace: float = 0.0, killable: bool = True) -> None: ...
    def blocked_on(self, delivery: _Delivery) -> None: ...
    def unblocked(self, delivery: Optional[_Delivery] = None) -> None: ...
    def finished(self) -> None: ...

@final
class _SlotTable:
    def __new__(cls, len: int) -> _SlotTable: ...
    @property
    def path(self) -> str: ...
    def view(self, index: int) -> dict[str, Any]: ...

@final
class _StopSignals:
    """The core's rule for stop signals: the first stops gracefully, one at least
    ``_URGENT_AFTER`` later stops at once."""

    def __init__(self) -> None: ...
    def received(self) -> bool: ...

@final
class _Supervisor:
    def __new__(
        cls, command: list[str], processes: int, timeout: Optional[float], scaler: _Scaler, queues: list[DelayQueue]
    ) -> _Supervisor: ...
    @staticmethod
    def needed(processes: int, timeout: Optional[float]) -> bool: ...
    def signal(self, signum: int) -> None: ...
    def run(self) -> tuple[dict[str, Any], bool]: ...

_URGENT_AFTER: float
# How long a coroutine handler cancelled at its timeout may take to end.
_CANCEL_GRACE: float
# Time past the timeout a supervisor allows a process of coroutine handlers.
_COROUTINE_GRACE: float
