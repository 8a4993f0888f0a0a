<?php

declare(strict_types=1);

namespace Delayq\Laravel;

use DateTimeInterface;
use Delayq\Claim;
use Illuminate\Container\Container;
use Illuminate\Contracts\Queue\Job as JobContract;
use Illuminate\Queue\Jobs\Job;
use Throwable;

/**
 * A Laravel job on a leased delayq message: delete() acknowledges it, release($delay)
 * runs it again after $delay seconds, fail() sends it to delayq's dead-letter set
 * (besides Laravel's failed-jobs table, from which queue:retry brings it back).
 */
class DelayqJob extends Job implements JobContract
{
    private ?Throwable $failure = null;
    private string $rawBody;

    public function __construct(
        Container $container,
        private DelayqQueue $delayq,
        private Claim $claim,
        ?string $connectionName,
        string $queue,
    ) {
        $this->container = $container;
        $this->connectionName = $connectionName;
        $this->queue = $queue;
        $this->rawBody = json_encode($claim->payload, JSON_THROW_ON_ERROR | JSON_PRESERVE_ZERO_FRACTION
            | JSON_UNESCAPED_SLASHES | JSON_UNESCAPED_UNICODE);
    }

    public function getJobId()
    {
        return $this->claim->message->id;
    }

    public function getRawBody()
    {
        return $this->rawBody;
    }

    /** Deliveries so far, this one included, as delayq counts them (a crash counts too). */
    public function attempts()
    {
        return $this->claim->message->attempt;
    }

    public function fail($e = null)
    {
        $this->failure = $e;
        parent::fail($e);
    }

    public function delete()
    {
        parent::delete();
        if ($this->claim->isFinished()) {
            return;
        }
        if ($this->hasFailed()) {
            $e = $this->failure;
            $this->claim->deadLetter($e === null ? 'failed by the job'
                : get_class($e) . ': ' . $e->getMessage());
        } else {
            $this->claim->ack();
        }
    }

    public function release($delay = 0)
    {
        parent::release($delay);
        if ($delay instanceof DateTimeInterface) {
            $delay = $delay->getTimestamp() - time();
        }
        if (!$this->claim->isFinished()) {
            $this->claim->retryLater((float) $delay, 'released by the job');
        }
    }

    public function getDelayqQueue(): DelayqQueue
    {
        return $this->delayq;
    }
}
