<?php

declare(strict_types=1);

namespace Delayq\Laravel;

use Delayq\Laravel\Console\WorkCommand;
use Illuminate\Console\Events\CommandFinished;
use Illuminate\Console\Events\CommandStarting;
use Illuminate\Queue\Events\JobExceptionOccurred;
use Illuminate\Queue\Events\WorkerStopping;
use Illuminate\Queue\QueueManager;
use Illuminate\Support\ServiceProvider;
use InvalidArgumentException;
use Symfony\Component\Console\Input\InputInterface;
use Throwable;

/**
 * Registers the 'delayq' queue driver and the delayq:work command, makes
 * queue:restart stop delayq's native pools too, tells pop() how long queue:work
 * sleeps when idle, keeps a failed job's exception as the reason of its retry, and
 * stops the consumers when the worker stops. Found by package discovery.
 */
class DelayqServiceProvider extends ServiceProvider
{
    /** queue:work's --sleep when it works one queue, else 0 (see DelayqQueue::setIdleSleep). */
    private float $idleSleep = 0.0;

    public function register()
    {
        $this->app->afterResolving('queue', function (QueueManager $manager) {
            $manager->addConnector('delayq', fn () => new DelayqConnector($this->idleSleep));
        });
        $this->app->singleton(WorkCommand::class, fn ($app) => new WorkCommand($app['queue.worker'], $app['cache.store']));
    }

    public function boot()
    {
        $this->validateConnections();
        if ($this->app->runningInConsole()) {
            $this->commands([WorkCommand::class]);
            $events = $this->app['events'];
            $events->listen(CommandFinished::class, function (CommandFinished $event) {
                if ($event->command === 'queue:restart' && $event->exitCode === 0) {
                    $this->restartNativePools();
                }
            });
            $events->listen(CommandStarting::class, function (CommandStarting $event) {
                if ($event->command === 'queue:work') {
                    $this->idleSleep = self::idleSleepOf($event->input);
                    // A connection the application made at boot was built without it.
                    foreach ($this->connectedQueues() as $queue) {
                        $queue->setIdleSleep($this->idleSleep);
                    }
                }
            });
            $events->listen(WorkerStopping::class, fn () => $this->stopConsumers());
            $events->listen(JobExceptionOccurred::class, function (JobExceptionOccurred $event) {
                if ($event->job instanceof DelayqJob) {
                    $event->job->noteException($event->exception);
                }
            });
        }
    }

    /**
     * queue:work's --sleep (3 by default), or 0 when it works several queues: pop()
     * waits on one queue at a time, and a wait on one would hold the others back.
     */
    private static function idleSleepOf(InputInterface $input): float
    {
        $queues = (string) $input->getParameterOption('--queue', '', true);
        if (str_contains($queues, ',')) {
            return 0.0;
        }
        $sleep = $input->getParameterOption('--sleep', 3, true);
        return is_numeric($sleep) ? max(0.0, (float) $sleep) : 3.0;
    }

    /** The worker stops (its end, or the kill of a job past its timeout). */
    private function stopConsumers(): void
    {
        foreach ($this->connectedQueues() as $queue) {
            $queue->stopConsumers();
        }
    }

    /** @return list<DelayqQueue> the delayq connections made so far, without making others */
    private function connectedQueues(): array
    {
        $manager = $this->app['queue'];
        $queues = [];
        foreach (array_keys($this->delayqConnections()) as $name) {
            if ($manager->connected($name)) {
                $queue = $manager->connection($name);
                if ($queue instanceof DelayqQueue) {
                    $queues[] = $queue;
                }
            }
        }
        return $queues;
    }

    /** Each delayq connection's queues, without connecting to Redis. */
    private function delayqConnections(): array
    {
        $connections = $this->app['config']->get('queue.connections', []);
        return array_filter(is_array($connections) ? $connections : [],
            fn ($c) => is_array($c) && ($c['driver'] ?? null) === 'delayq');
    }

    /** A bad URL or option, or a missing extension, fails here: at boot, not at the first job. */
    private function validateConnections(): void
    {
        foreach ($this->delayqConnections() as $name => $config) {
            try {
                (new DelayqConnector())->connect($config);
            } catch (Throwable $e) {
                throw new InvalidArgumentException("queue connection [$name] (driver delayq): {$e->getMessage()}", 0, $e);
            }
        }
    }

    /**
     * queue:restart stores a timestamp in the cache, which queue:work polls; delayq:work
     * runs native pools that listen to restartWorkers() instead.
     */
    private function restartNativePools(): void
    {
        foreach (array_keys($this->delayqConnections()) as $name) {
            try {
                $queue = $this->app['queue']->connection($name);
                $queue->getDelayQueue()->restartWorkers();
            } catch (Throwable $e) {
                // One Redis down must not hide the others' restart; say so and go on.
                fwrite(STDERR, "delayq: restartWorkers() on connection [$name] failed: {$e->getMessage()}\n");
            }
        }
    }
}
