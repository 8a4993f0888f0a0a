<?php

declare(strict_types=1);

namespace Delayq;

use DelayQueueMessage;
use Fiber;
use LogicException;

/**
 * One message taken by Claimer (or handed to a DelayQueueWorker handler), leased until
 * ack(), retryLater() or deadLetter().
 */
final class Claim
{
    private bool $finished = false;

    /**
     * @param Fiber|null $fiber the suspended one-message pool, or null inside a handler
     *   of DelayQueueWorker::run(), whose return acknowledges
     */
    public function __construct(
        public readonly mixed $payload,
        public readonly DelayQueueMessage $message,
        private ?Fiber $fiber = null,
        private ?StopSignals $signals = null,
    ) {
    }

    public function ack(): void
    {
        $this->finish();
    }

    /** Runs it again after $delay seconds; counts as an attempt. */
    public function retryLater(float $delay, string $reason): void
    {
        $this->assertOpen();
        $this->message->retryLater(max(0.0, $delay), $reason);
        $this->finish();
    }

    /**
     * Fails this delivery as a handler's exception would: delayq retries it with its
     * backoff, and past max_attempts it goes to the dead-letter set.
     */
    public function fail(string $reason): void
    {
        $this->assertOpen();
        if ($this->fiber === null) {
            throw new LogicException('inside a DelayQueueWorker handler, fail by throwing');
        }
        $this->finish($reason);
    }

    /** To the dead-letter set now, with $reason as its last error. */
    public function deadLetter(string $reason): void
    {
        $this->assertOpen();
        $this->message->deadLetter($reason);
        $this->finish();
    }

    public function isFinished(): bool
    {
        return $this->finished;
    }

    /**
     * Undecided (the framework dropped it): PHP cannot switch fibers in a destructor, and
     * destroying a Fiber suspended inside run() crashes the extension, so the pool's
     * fiber is handed to Claimer, which fails the delivery at its next claim or at
     * shutdown (it then runs again after a backoff).
     */
    public function __destruct()
    {
        if (!$this->finished && $this->fiber !== null && $this->fiber->isSuspended()) {
            Claimer::adoptUndecided($this->fiber, $this->signals);
            return;
        }
        $this->signals?->release();
    }

    private function assertOpen(): void
    {
        if ($this->finished) {
            throw new LogicException("delayq message {$this->message->id} was decided already");
        }
    }

    private function finish(?string $failure = null): void
    {
        $this->assertOpen();
        $this->finished = true;
        $fiber = $this->fiber;
        $this->fiber = null;
        if ($fiber !== null) {
            Claimer::resume($fiber, $this->signals, $failure);
        }
    }
}
