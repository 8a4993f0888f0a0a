<?php

declare(strict_types=1);

namespace Delayq\Laravel;

use DateTimeInterface;
use DelayQueueMessage;
use Illuminate\Container\Container;
use Illuminate\Contracts\Queue\Job as JobContract;
use Illuminate\Queue\Jobs\Job;
use Throwable;

/**
 * A Laravel job on a leased delayq message: delete() acknowledges it, release($delay)
 * runs it again after $delay seconds, fail() sends it to delayq's dead-letter set
 * (besides Laravel's failed-jobs table, from which queue:retry brings it back).
 * A message of pop() is decided at once, each decision written before the call
 * returns; one of delayq:work's pool is decided when its handler returns.
 */
class DelayqJob extends Job implements JobContract
{
    private ?Throwable $failure = null;
    /** The exception that the job's last run threw, for the reason of a release. */
    private ?Throwable $thrown = null;
    private bool $decided = false;
    private string $rawBody;

    public function __construct(
        Container $container,
        private DelayqQueue $delayq,
        private DelayQueueMessage $message,
        private bool $pulled,
        ?string $connectionName,
        string $queue,
    ) {
        $this->container = $container;
        $this->connectionName = $connectionName;
        $this->queue = $queue;
        $this->rawBody = json_encode($message->payload, JSON_THROW_ON_ERROR | JSON_PRESERVE_ZERO_FRACTION
            | JSON_UNESCAPED_SLASHES | JSON_UNESCAPED_UNICODE);
    }

    public function getJobId()
    {
        return $this->message->id;
    }

    public function getRawBody()
    {
        return $this->rawBody;
    }

    /** Deliveries so far, this one included, as delayq counts them (a crash counts too). */
    public function attempts()
    {
        return $this->message->attempt;
    }

    public function fail($e = null)
    {
        $this->failure = $e;
        parent::fail($e);
    }

    /** @internal the exception the worker caught, reported before it releases the job */
    public function noteException(Throwable $e): void
    {
        $this->thrown = $e;
    }

    public function delete()
    {
        parent::delete();
        if ($this->decided) {
            return;
        }
        $this->decided = true;
        if ($this->hasFailed()) {
            $e = $this->failure;
            $this->message->deadLetter($e === null ? 'failed by the job' : self::describe($e));
        } elseif ($this->pulled) {
            $this->message->ack();
        }
    }

    public function release($delay = 0)
    {
        parent::release($delay);
        if ($delay instanceof DateTimeInterface) {
            $delay = $delay->getTimestamp() - time();
        }
        if (!$this->decided) {
            $this->decided = true;
            $e = $this->thrown;
            $this->message->retryLater(max(0.0, (float) $delay), $e === null ? 'released by the job' : self::describe($e));
        }
    }

    public function getDelayqQueue(): DelayqQueue
    {
        return $this->delayq;
    }

    private static function describe(Throwable $e): string
    {
        return get_class($e) . ': ' . $e->getMessage();
    }
}
