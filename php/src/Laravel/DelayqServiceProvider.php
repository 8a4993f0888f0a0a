<?php

declare(strict_types=1);

namespace Delayq\Laravel;

use Delayq\Laravel\Console\WorkCommand;
use Illuminate\Console\Events\CommandFinished;
use Illuminate\Queue\QueueManager;
use Illuminate\Support\ServiceProvider;
use InvalidArgumentException;
use Throwable;

/**
 * Registers the 'delayq' queue driver and the delayq:work command, and makes
 * queue:restart stop delayq's native pools too. Found by package discovery.
 */
class DelayqServiceProvider extends ServiceProvider
{
    public function register()
    {
        $this->app->afterResolving('queue', function (QueueManager $manager) {
            $manager->addConnector('delayq', fn () => new DelayqConnector());
        });
        $this->app->singleton(WorkCommand::class, fn ($app) => new WorkCommand($app['queue.worker'], $app['cache.store']));
    }

    public function boot()
    {
        $this->validateConnections();
        if ($this->app->runningInConsole()) {
            $this->commands([WorkCommand::class]);
            $this->app['events']->listen(CommandFinished::class, function (CommandFinished $event) {
                if ($event->command === 'queue:restart' && $event->exitCode === 0) {
                    $this->restartNativePools();
                }
            });
        }
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
