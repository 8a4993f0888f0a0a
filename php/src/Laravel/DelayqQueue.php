<?php

declare(strict_types=1);

namespace Delayq\Laravel;

use DateInterval;
use DateTimeInterface;
use Delayq\Receiver;
use DelayQueue;
use DelayQueueMessage;
use Illuminate\Contracts\Queue\ClearableQueue;
use Illuminate\Contracts\Queue\Queue as QueueContract;
use Illuminate\Queue\Queue;

/**
 * Laravel's queue on delayq: one DelayQueue per Laravel queue name, on the same Redis.
 * Pushes are one round trip with the due time on the Redis server's clock; pop() takes
 * the next due message from a consumer that lives as long as the worker process (see
 * Receiver), leased until the job is deleted, released or failed.
 */
class DelayqQueue extends Queue implements QueueContract, ClearableQueue
{
    /** @var array<string, DelayQueue> */
    private array $queues = [];
    /** @var array<string, Receiver> */
    private array $receivers = [];
    /** Seconds queue:work sleeps after an empty pop() (see setIdleSleep). */
    private float $idleSleep = 0.0;

    /**
     * @param array<string, mixed> $options DelayQueue options ('prefix', 'persistent', ...)
     * @param float $lease seconds a dead worker's job waits before it runs again ('retry_after')
     * @param float $blockFor seconds pop() waits for a due job ('block_for')
     */
    public function __construct(
        #[\SensitiveParameter]
        private string $url,
        private string $default,
        private array $options,
        private float $lease,
        private float $blockFor = 1.0,
        bool $dispatchAfterCommit = false,
    ) {
        $this->dispatchAfterCommit = $dispatchAfterCommit;
        // Validates the URL and every option now, without connecting.
        $this->receiver($default);
    }

    /** print_r() and var_dump() show the URL without its user and password. */
    public function __debugInfo(): array
    {
        $shown = get_object_vars($this);
        // Up to the last "@": a password may hold "@" or "/".
        $shown['url'] = (string) preg_replace('#^([a-z+]+://).*@#is', '$1****@', $this->url);
        unset($shown['container']);
        return $shown;
    }

    public function getDelayQueue(?string $queue = null): DelayQueue
    {
        $name = $this->getQueue($queue);
        return $this->queues[$name] ??= new DelayQueue($this->url, $name, $this->options);
    }

    /** @return array<string, mixed> DelayQueueWorker options that make Laravel's worker decide retries */
    public function workerOptions(): array
    {
        // Laravel counts tries and computes backoff itself and ends a job with release()
        // or fail(): delayq's own limit must never come first.
        return ['lease' => $this->lease, 'max_attempts' => 4294967295];
    }

    public function getQueue(?string $queue): string
    {
        return $queue ?: $this->default;
    }

    public function size($queue = null)
    {
        $stats = $this->getDelayQueue($queue)->stats();
        return $stats['scheduled'] + $stats['ready'] + $stats['inflight'];
    }

    public function push($job, $data = '', $queue = null)
    {
        return $this->enqueueUsing(
            $job,
            $this->createPayload($job, $this->getQueue($queue), $data),
            $queue,
            null,
            fn ($payload, $queue) => $this->pushRaw($payload, $queue),
        );
    }

    public function later($delay, $job, $data = '', $queue = null)
    {
        return $this->enqueueUsing(
            $job,
            $this->createPayload($job, $this->getQueue($queue), $data),
            $queue,
            $delay,
            fn ($payload, $queue, $delay) => $this->pushRaw($payload, $queue, ['delay' => $delay]),
        );
    }

    /**
     * The payload's uuid becomes the message id: pushing the same payload twice keeps one
     * message, and queue:retry, which pushes a failed job's payload again, brings its
     * dead letter back ('replace') instead of adding a second copy.
     *
     * @param array{delay?: DateTimeInterface|DateInterval|int|float} $options
     */
    public function pushRaw($payload, $queue = null, array $options = [])
    {
        $decoded = json_decode($payload, true, 512, JSON_THROW_ON_ERROR);
        $pushOptions = ['replace' => true];
        if (isset($decoded['uuid']) && is_string($decoded['uuid']) && $decoded['uuid'] !== '') {
            $pushOptions['id'] = $decoded['uuid'];
        }
        $delay = $options['delay'] ?? 0;
        $delayQueue = $this->getDelayQueue($queue);
        if ($delay instanceof DateTimeInterface) {
            return $delayQueue->pushAt($decoded, $delay, $pushOptions);
        }
        if ($delay instanceof DateInterval) {
            $delay = (new \DateTimeImmutable('@0'))->add($delay)->getTimestamp();
        }
        return $delayQueue->push($decoded, max(0.0, (float) $delay), $pushOptions);
    }

    /**
     * The next due job, waiting up to block_for seconds for one, and longer for one
     * due within the worker's sleep (see setIdleSleep).
     */
    public function pop($queue = null)
    {
        $message = $this->receiver($this->getQueue($queue))->receive();
        return $message === null ? null : $this->jobFor($message, true);
    }

    /**
     * queue:work sleeps this long after an empty pop() (its --sleep): a job due within
     * it is waited for inside pop() instead, so that it starts on time. Set by the
     * service provider when queue:work works one queue of this connection.
     */
    public function setIdleSleep(float $seconds): void
    {
        $this->idleSleep = max(0.0, $seconds);
        foreach ($this->receivers as $receiver) {
            $receiver->setIdleSleep($this->idleSleep);
        }
    }

    /** Gives back what the consumers hold unstarted and ends their threads (a worker's end). */
    public function stopConsumers(): void
    {
        foreach ($this->receivers as $receiver) {
            $receiver->stop();
        }
    }

    /**
     * @internal also used by delayq:work for the messages of its native pool
     * @param bool $pulled from pop() (the job decides at once) or a DelayQueueWorker
     *   handler (whose return acknowledges)
     */
    public function jobFor(DelayQueueMessage $message, bool $pulled): DelayqJob
    {
        return new DelayqJob($this->container, $this, $message, $pulled, $this->connectionName, $message->queue);
    }

    public function clear($queue)
    {
        return $this->getDelayQueue($queue)->purge();
    }

    private function receiver(string $name): Receiver
    {
        return $this->receivers[$name] ??= new Receiver($this->getDelayQueue($name), $this->workerOptions(), $this->blockFor, $this->idleSleep);
    }
}
