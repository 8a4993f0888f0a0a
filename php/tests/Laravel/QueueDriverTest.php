<?php

declare(strict_types=1);

namespace Delayq\Tests\Laravel;

use DelayQueue;
use Delayq\Tests\RedisServer;
use PHPUnit\Framework\TestCase;

use function Delayq\Tests\wait_for;

/**
 * The delayq driver inside a real Laravel 8 application (Debian's php-laravel-framework):
 * jobs dispatched through artisan, consumed by `artisan queue:work` (Laravel's own
 * Illuminate\Queue\Worker) and by `artisan delayq:work` (the native pool), against a
 * private redis-server. Failed jobs go to Laravel's database-uuids provider on SQLite.
 */
final class QueueDriverTest extends TestCase
{
    private RedisServer $redis;
    private LaravelApp $app;

    protected function setUp(): void
    {
        $this->redis = new RedisServer();
        $this->app = new LaravelApp($this->redis->url(), ['DELAYQ_RETRY_AFTER' => '2']);
    }

    protected function tearDown(): void
    {
        $this->app->destroy();
        $this->redis->stop();
    }

    public function testDelayedJobRunsOnceAtItsTimeUnderQueueWork(): void
    {
        $due = $this->dispatch(['RecordRun', 'close-order-1', '--delay=2']);
        $this->assertSame(1, $this->queue()->stats()['scheduled'], 'dispatch()->delay() waits in delayq');
        $worker = $this->app->start(['queue:work', '--sleep=1']);

        wait_for(30, 'the job to run', fn () => count($this->app->runs()) >= 1);
        $this->waitUntilDrained();
        posix_kill($worker, SIGTERM);
        $this->assertSame(0, $this->app->waitFor($worker, 30), $this->app->output());

        $runs = $this->app->runs();
        $this->assertCount(1, $runs, 'ran exactly once');
        $this->assertSame('close-order-1', $runs[0]['label']);
        $this->assertSame(1, $runs[0]['attempt']);
        $this->assertGreaterThanOrEqual($due - 0.01, $runs[0]['at'], 'not before its due time');
        $stats = $this->queue()->stats();
        $this->assertSame(1, $stats['acked']);
        $this->assertSame(0, $stats['dead']);
    }

    public function testDelayedJobRunsOnceUnderTheNativePoolAndQueueRestartStopsIt(): void
    {
        $due = $this->dispatch(['RecordRun', 'close-order-2', '--delay=2', '--later']);
        $worker = $this->app->start(['delayq:work', '--processes=2']);

        wait_for(30, 'the job to run', fn () => count($this->app->runs()) >= 1);
        $this->waitUntilDrained();
        wait_for(30, 'the pool to register', fn () => count($this->queue()->workers()) >= 1);
        // queue:restart reaches the native pool through DelayQueue::restartWorkers().
        $this->app->mustRun(['queue:restart']);
        $this->assertSame(0, $this->app->waitFor($worker, 30), $this->app->output());

        $runs = $this->app->runs();
        $this->assertCount(1, $runs, 'ran exactly once');
        $this->assertSame('close-order-2', $runs[0]['label']);
        $this->assertNotSame($worker, $runs[0]['pid'], 'ran in a handler process of the pool');
        $this->assertGreaterThanOrEqual($due - 0.01, $runs[0]['at'], 'not before its due time');
        $this->assertSame(1, $this->queue()->stats()['acked']);
    }

    public function testFailingJobRetriesWithItsBackoffThenLandsInFailedJobsAndQueueRetryRevivesIt(): void
    {
        $this->app->mustRun(['queue:failed-table']);
        $this->app->mustRun(['migrate', '--force']);
        $this->dispatch(['FailingJob', 'charge-7']);
        // --tries=1 on the command: FailingJob's own $tries = 3 must win, as in Laravel.
        $worker = $this->app->start(['queue:work', '--sleep=1', '--tries=1']);

        wait_for(60, 'the job to fail for good', fn () => count($this->app->failedJobs()) === 1);
        $runs = $this->app->runs();
        $this->assertSame([1, 2, 3], array_column($runs, 'attempt'));
        $this->assertSame(['failed', 'failed', 'failed'], array_column($runs, 'event'));
        // FailingJob::$backoff = [1, 2]: the second run waits 1 s, the third 2 s.
        $this->assertGreaterThanOrEqual(1.0, $runs[1]['at'] - $runs[0]['at']);
        $this->assertGreaterThanOrEqual(2.0, $runs[2]['at'] - $runs[1]['at']);

        $failed = $this->app->failedJobs()[0];
        $this->assertSame($runs[0]['job_id'], $failed['uuid']);
        $this->assertSame('delayq', $failed['connection']);
        $this->assertStringContainsString('payment provider down for charge-7', $failed['exception']);
        $dead = $this->queue()->deadLetters();
        $this->assertCount(1, $dead, 'fail() sends the message to the dead-letter set');
        $this->assertSame($failed['uuid'], $dead[0]['id']);
        $this->assertStringContainsString('payment provider down for charge-7', $dead[0]['last_error']);

        // The fix is deployed; queue:retry pushes the payload again, which brings the dead letter back.
        touch($this->app->log . '.fixed');
        $this->app->mustRun(['queue:retry', 'all']);
        wait_for(30, 'the retried job to run', fn () => count($this->app->runs()) === 4);
        $this->waitUntilDrained();
        posix_kill($worker, SIGTERM);
        $this->assertSame(0, $this->app->waitFor($worker, 30), $this->app->output());

        $last = $this->app->runs()[3];
        $this->assertSame('ran', $last['event']);
        $this->assertSame($failed['uuid'], $last['job_id'], 'the same message, not a copy');
        $this->assertSame([], $this->queue()->deadLetters());
        $this->assertSame([], $this->app->failedJobs());
        $this->assertCount(4, $this->app->runs(), 'nothing ran twice');
    }

    public function testKill9OfQueueWorkMidJobLosesNothing(): void
    {
        $this->dispatch(['SlowJob', 'refund-3']);
        $first = $this->app->start(['queue:work', '--sleep=1']);
        wait_for(30, 'the first attempt to start', fn () => count($this->app->runs()) === 1);
        $this->assertSame(1, $this->queue()->stats()['inflight']);
        posix_kill($first, SIGKILL);
        $this->assertSame(128 + SIGKILL, $this->app->waitFor($first, 10));

        // retry_after (the lease) is 2 s: a new worker gets the job once it has passed.
        $second = $this->app->start(['queue:work', '--sleep=1']);
        wait_for(60, 'the job to run again', fn () => count($this->app->runs()) === 3);
        $this->waitUntilDrained();
        posix_kill($second, SIGTERM);
        $this->assertSame(0, $this->app->waitFor($second, 30), $this->app->output());

        $runs = $this->app->runs();
        $this->assertSame(['started', 'started', 'ran'], array_column($runs, 'event'));
        $this->assertSame([1, 2, 2], array_column($runs, 'attempt'));
        $this->assertSame($first, $runs[0]['pid']);
        $this->assertSame($second, $runs[2]['pid']);
        $this->assertSame(1, $this->queue()->stats()['acked']);
    }

    public function testSigtermDuringAJobLetsItFinishThenStopsQueueWork(): void
    {
        $this->dispatch(['WaitingJob', 'ship-5']);
        $worker = $this->app->start(['queue:work', '--sleep=1']);
        wait_for(30, 'the job to start', fn () => count($this->app->runs()) === 1);
        // While the job runs, the one-message pool's run() is under way: the signal
        // must still reach Laravel's worker, after the job.
        posix_kill($worker, SIGTERM);
        touch($this->app->log . '.go');
        $this->assertSame(0, $this->app->waitFor($worker, 30), $this->app->output());

        $this->assertSame(['started', 'ran'], array_column($this->app->runs(), 'event'));
        $stats = $this->queue()->stats();
        $this->assertSame(1, $stats['acked'], 'the job finished and was acknowledged before the worker stopped');
        $this->assertSame(0, $stats['scheduled'] + $stats['ready'] + $stats['inflight']);
    }

    public function testBadConfigurationFailsAtBootNamingIt(): void
    {
        [$code, $out, $err] = $this->app->artisan(['list'], ['DELAYQ_URL' => 'http://127.0.0.1:1']);
        $this->assertNotSame(0, $code);
        $this->assertStringContainsString('queue connection [delayq]', $out . $err);
        $this->assertStringContainsString('http://127.0.0.1:1', $out . $err);

        [$code, $out, $err] = $this->app->artisan(['list'], ['DELAYQ_EXTRA_CONFIG' => '{"retry_afterr": 5}']);
        $this->assertNotSame(0, $code);
        $this->assertStringContainsString("unknown option 'retry_afterr'", $out . $err);

        [$code, $out, $err] = $this->app->artisan(['list'], ['DELAYQ_OPTIONS' => '{"prefixx": "dq"}']);
        $this->assertNotSame(0, $code);
        $this->assertStringContainsString('prefixx', $out . $err);

        // PHP without its ini files, so without delayq (mbstring is Laravel's own need).
        [$code, $out, $err] = $this->app->artisan(['list'], [], [PHP_BINARY, '-n', '-d', 'extension=mbstring']);
        $this->assertNotSame(0, $code);
        $this->assertStringContainsString('needs the delayq PHP extension, which is not loaded', $out . $err);

        $this->assertSame(0, $this->app->artisan(['list'])[0], 'the same application boots with a good configuration');
    }

    /** @return float the due time the dispatch command printed */
    private function dispatch(array $args): float
    {
        return json_decode($this->app->mustRun(array_merge(['app:dispatch'], $args)), true)['due'];
    }

    private function queue(): DelayQueue
    {
        return new DelayQueue($this->redis->url(), 'default');
    }

    private function waitUntilDrained(): void
    {
        wait_for(30, 'the queue to drain', function () {
            $s = $this->queue()->stats();
            return $s['scheduled'] + $s['ready'] + $s['inflight'] === 0;
        });
    }
}
