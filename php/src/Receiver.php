<?php

declare(strict_types=1);

namespace Delayq;

use DelayQueue;
use DelayQueueConsumer;
use DelayQueueMessage;
use DelayQueueWorker;

/**
 * One queue's messages for a framework's worker, which asks for the next job and
 * decides its fate later (Laravel's pop(), Messenger's get()): a DelayQueueConsumer
 * started at the first ask and kept for the life of the process, its leases renewed
 * by the pool's threads while the framework runs a job.
 */
final class Receiver
{
    private ?DelayQueueConsumer $consumer = null;

    /**
     * @param array<string, mixed> $workerOptions DelayQueueWorker options (lease, max_attempts, ...)
     * @param float $wait how long receive() waits for a due message, in seconds
     * @param float $idleSleep how long the framework sleeps after an empty answer: a
     *   message due within it is waited for instead, so that it starts on time
     */
    public function __construct(
        private DelayQueue $queue,
        private array $workerOptions,
        private float $wait,
        private float $idleSleep = 0.0,
    ) {
        // Validates the options now, so that bad ones fail at boot and not at the first receive.
        new DelayQueueWorker($queue, $this->poolOptions());
    }

    public function queue(): DelayQueue
    {
        return $this->queue;
    }

    public function setIdleSleep(float $seconds): void
    {
        $this->idleSleep = max(0.0, $seconds);
    }

    /** The next due message, or null if none came within the wait. */
    public function receive(?float $wait = null): ?DelayQueueMessage
    {
        $consumer = $this->consumer();
        $message = $consumer->receive($wait ?? $this->wait);
        if ($message === null && !$consumer->isStopped()) {
            $next = $consumer->nextDueIn();
            if ($next !== null && $next <= $this->idleSleep) {
                $message = $consumer->receive($next + $this->wait);
            }
        }
        return $message;
    }

    /** Gives back what the pool holds unstarted and ends its threads. */
    public function stop(): void
    {
        $this->consumer?->stop();
        $this->consumer = null;
    }

    private function consumer(): DelayQueueConsumer
    {
        if ($this->consumer?->isStopped()) {
            // Stopped by DelayQueue::restartWorkers(): the framework's own restart
            // signal decides when this process ends; until then, a new pool serves it.
            $this->stop();
        }
        return $this->consumer ??= (new DelayQueueWorker($this->queue, $this->poolOptions()))->consumer();
    }

    /** @return array<string, mixed> */
    private function poolOptions(): array
    {
        // One job at a time, claimed when the framework asks: nothing waits prefetched.
        return ['threads' => 1, 'batch' => 1, 'prefetch' => 0] + $this->workerOptions;
    }
}
