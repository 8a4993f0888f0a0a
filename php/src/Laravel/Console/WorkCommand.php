<?php

declare(strict_types=1);

namespace Delayq\Laravel\Console;

use Delayq\Laravel\DelayqQueue;
use DelayQueueMessage;
use DelayQueueWorker;
use Illuminate\Contracts\Debug\ExceptionHandler;
use Illuminate\Queue\Console\WorkCommand as LaravelWorkCommand;
use InvalidArgumentException;
use Throwable;

/**
 * queue:work's options and output, with delayq's native pool (DelayQueueWorker) in
 * place of Laravel's polling loop: Redis I/O on native threads, several processes
 * supervised by the extension. Each job still goes through Laravel's Worker::process,
 * so tries, backoff, events and the failed-jobs table behave as under queue:work.
 */
class WorkCommand extends LaravelWorkCommand
{
    protected $signature = 'delayq:work
                            {connection? : The name of the delayq queue connection to work}
                            {--name=default : The name of the worker}
                            {--queue= : The names of the queues to work, highest priority first}
                            {--once : Only process the next job on the queue}
                            {--stop-when-empty : Stop when the queue is empty}
                            {--delay=0 : The number of seconds to delay failed jobs (Deprecated)}
                            {--backoff=0 : The number of seconds to wait before retrying a job that encountered an uncaught exception}
                            {--max-jobs=0 : The number of jobs each process handles before it is replaced}
                            {--max-time=0 : The maximum number of seconds each process runs before it is replaced}
                            {--force : Force the worker to run even in maintenance mode}
                            {--memory=128 : The memory limit in megabytes of each process}
                            {--sleep=3 : Unused: the pool waits for messages without polling}
                            {--rest=0 : Unused}
                            {--timeout=60 : The number of seconds a job may run before its process is killed (0: no limit)}
                            {--tries=1 : Number of times to attempt a job before logging it failed}
                            {--processes=1 : Handler processes, supervised by the extension}
                            {--threads=1 : Native Redis threads per process}';

    protected $description = 'Run delayq\'s native worker pool for Laravel jobs';

    protected function runWorker($connection, $queue)
    {
        $delayq = $this->laravel['queue']->connection($connection);
        if (!$delayq instanceof DelayqQueue) {
            throw new InvalidArgumentException("delayq:work: queue connection [$connection] does not use the delayq driver");
        }
        $names = array_values(array_filter(explode(',', (string) $queue), 'strlen'));
        $main = $delayq->getDelayQueue($names[0] ?? null);
        $lower = array_map(fn ($name) => $delayq->getDelayQueue($name), array_slice($names, 1));
        $options = $this->gatherWorkerOptions();

        $poolOptions = $delayq->workerOptions() + [
            'threads' => (int) $this->option('threads'),
            'processes' => (int) $this->option('processes'),
            'max_memory_mb' => (int) $options->memory,
            'stop_when_empty' => (bool) ($options->stopWhenEmpty || $this->option('once')),
            'on_start' => fn () => $this->forgetDatabaseConnections(),
        ];
        if ($lower !== []) {
            $poolOptions['lower_queues'] = $lower;
        }
        if ($this->option('once')) {
            $poolOptions['max_jobs'] = 1;
        } elseif ((int) $options->maxJobs > 0) {
            $poolOptions['max_jobs'] = (int) $options->maxJobs;
        }
        if ((float) $options->maxTime > 0) {
            $poolOptions['max_time'] = (float) $options->maxTime;
        }
        if ((float) $options->timeout > 0) {
            $poolOptions['timeout'] = (float) $options->timeout;
        }
        $pool = new DelayQueueWorker($main, $poolOptions);

        $worker = $this->worker->setName($options->name)->setCache($this->cache);
        $exceptions = $this->laravel[ExceptionHandler::class];
        $pool->run(function (mixed $payload, DelayQueueMessage $message) use ($delayq, $worker, $connection, $options, $exceptions) {
            $job = $delayq->jobFor($message, false);
            try {
                $worker->process($connection, $job, $options);
            } catch (Throwable $e) {
                // Laravel's Worker has released or failed the job already (it rethrows
                // only to report): report as queue:work does, and let the decision stand.
                $exceptions->report($e);
            }
        });
        return 0;
    }

    /** A forked handler process must not share its parent's database sockets. */
    private function forgetDatabaseConnections(): void
    {
        if ($this->laravel->bound('db')) {
            $db = $this->laravel['db'];
            foreach (array_keys($db->getConnections()) as $name) {
                $db->purge($name);
            }
        }
    }
}
