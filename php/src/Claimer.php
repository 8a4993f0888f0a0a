<?php

declare(strict_types=1);

namespace Delayq;

use DelayQueue;
use DelayQueueWorker;
use Fiber;
use Throwable;

/**
 * Takes one due message at a time, for frameworks whose workers ask for the next job
 * and decide its fate later (Laravel's pop(), Messenger's get()).
 *
 * The extension consumes only through DelayQueueWorker::run(), which calls a handler
 * and decides when the handler returns. So each claim runs a one-message pool
 * (max_jobs 1, no prefetch) inside a Fiber and suspends the handler: the message stays
 * leased, its lease renewed by the pool's native threads, until the framework decides
 * and Claim lets the handler return. A process that dies meanwhile stops renewing the
 * lease, and the message is delivered again after it.
 */
final class Claimer
{
    /** @var array<string, mixed> */
    private array $workerOptions;
    /** @var array<int, array{Fiber, ?StopSignals}> claims under way, by fiber */
    private static array $suspended = [];
    /** @var array<int, array{Fiber, ?StopSignals}> claims dropped undecided */
    private static array $undecided = [];
    private static bool $shutdownRegistered = false;

    /**
     * @param array<string, mixed> $workerOptions DelayQueueWorker options (lease, max_attempts, ...)
     * @param float $waitFor how long claim() waits for a due message, in seconds
     */
    public function __construct(private DelayQueue $queue, array $workerOptions = [], float $waitFor = 1.0)
    {
        // Not stop_when_empty: such a pool stops when nothing is due without claiming the
        // expired lease of a dead worker's message; max_time bounds the wait instead, and
        // the pool's periodic look (idle_check) takes such messages back.
        $this->workerOptions = ['threads' => 1, 'batch' => 1, 'prefetch' => 0, 'max_jobs' => 1,
            'max_time' => max(0.05, $waitFor), 'idle_check' => min(1.0, max(0.05, $waitFor / 4))] + $workerOptions;
        // Validates the options now, so that bad ones fail at boot and not at the first claim.
        new DelayQueueWorker($queue, $this->workerOptions);
    }

    public function queue(): DelayQueue
    {
        return $this->queue;
    }

    /** The next due message, or null if none came within the wait. */
    public function claim(): ?Claim
    {
        self::failUndecided();
        if (!self::$shutdownRegistered) {
            self::$shutdownRegistered = true;
            register_shutdown_function(static fn () => self::failUndecided(true));
        }
        $worker = new DelayQueueWorker($this->queue, $this->workerOptions);
        $fiber = new Fiber(static function () use ($worker): array {
            return $worker->run(static function (mixed $payload, \DelayQueueMessage $message): void {
                // Returns once the framework decided: the pool then acknowledges, or
                // applies the decision that Claim made on $message; a failure comes back
                // as its reason, thrown so that delayq's backoff and dead letters apply.
                $failure = Fiber::suspend([$payload, $message]);
                if (is_string($failure)) {
                    throw new ClaimFailedException($failure);
                }
            });
        });
        $signals = StopSignals::hold();
        try {
            $claimed = $fiber->start();
        } catch (Throwable $e) {
            $signals->release();
            throw $e;
        }
        if ($fiber->isTerminated()) {
            $signals->release();
            self::afterRun($fiber->getReturn());
            return null;
        }
        [$payload, $message] = $claimed;
        self::$suspended[spl_object_id($fiber)] = [$fiber, $signals];
        return new Claim($payload, $message, $fiber, $signals);
    }

    /**
     * Lets a claimed message's handler return: its pool then acknowledges the message,
     * applies the decision made on it, or, with $failure, fails it.
     */
    public static function resume(Fiber $fiber, ?StopSignals $signals, ?string $failure): void
    {
        unset(self::$suspended[spl_object_id($fiber)]);
        try {
            $fiber->resume($failure);
        } finally {
            $signals?->release();
        }
        if ($fiber->isTerminated()) {
            self::afterRun($fiber->getReturn());
        }
    }

    /** @internal for Claim::__destruct() */
    public static function adoptUndecided(Fiber $fiber, ?StopSignals $signals): void
    {
        self::$undecided[spl_object_id($fiber)] = [$fiber, $signals];
    }

    /**
     * Fails the deliveries dropped undecided, and at shutdown every one still held: a
     * suspended pool must return before PHP destroys its fiber.
     */
    public static function failUndecided(bool $all = false): void
    {
        $pending = self::$undecided;
        if ($all) {
            $pending += self::$suspended;
        }
        self::$undecided = [];
        foreach ($pending as [$fiber, $signals]) {
            if ($fiber->isSuspended()) {
                try {
                    self::resume($fiber, $signals, $all ? 'the process ended with the delivery undecided'
                        : 'the delivery was dropped undecided');
                } catch (Throwable) {
                    // The lease brings the message back anyway.
                }
            }
        }
    }

    /**
     * A stop signal that reached the extension's handler during run() (from a thread
     * that does not block it) stopped the pool; PHP's own handlers are back once run()
     * has returned: pass the signal on, so that the framework's worker stops as it would.
     *
     * @param array<string, mixed> $summary what run() returned
     */
    public static function afterRun(array $summary): void
    {
        if (($summary['stopped_by'] ?? null) === 'signal' && function_exists('posix_kill')) {
            posix_kill(getmypid(), SIGTERM);
        }
    }
}
