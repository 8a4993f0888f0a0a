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
        $this->drainThenStop($worker);

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
        $this->drainThenStop($worker);

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
        $this->drainThenStop($second);

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

    public function testJobPastItsTimeoutIsFailedOnceAndTheWorkerKilledAsLaravelDoes(): void
    {
        $this->app->mustRun(['queue:failed-table']);
        $this->app->mustRun(['migrate', '--force']);
        // TimeoutJob: $timeout = 2, sleeps 30 s; queue:work's default --tries=1.
        $this->dispatch(['TimeoutJob', 'export-9']);
        $worker = $this->app->start(['queue:work', '--sleep=1']);
        wait_for(30, 'the job to start', fn () => count($this->app->runs()) === 1);
        $this->assertNoStopSignalBlocked($worker);

        $code = $this->app->waitFor($worker, 25);
        $ended = microtime(true);
        $started = $this->app->runs()[0]['at'];
        // Worker::kill(): WorkerStopping, then SIGKILL of itself, as with Laravel's own drivers.
        $this->assertSame(128 + SIGKILL, $code, $this->app->output());
        $this->assertLessThan($started + 2 + 4, $ended, 'killed at its timeout, not after its 30 s sleep');

        $runs = $this->app->runs();
        $this->assertSame(['started', 'failed-hook'], array_column($runs, 'event'), 'failed() ran once; the job did not finish');
        $failed = $this->app->failedJobs();
        $this->assertCount(1, $failed, 'one row in failed_jobs');
        $this->assertSame($runs[0]['job_id'], $failed[0]['uuid']);
        $this->assertStringContainsString('MaxAttemptsExceededException', $failed[0]['exception']);
        $dead = $this->queue()->deadLetters();
        $this->assertCount(1, $dead, 'the message is kept, once, in the dead-letter set');
        $this->assertSame($runs[0]['job_id'], $dead[0]['id']);
        $this->assertStringContainsString('MaxAttemptsExceededException', $dead[0]['last_error']);
        $stats = $this->queue()->stats();
        $this->assertSame(0, $stats['scheduled'] + $stats['ready'] + $stats['inflight']);

        // The same job under Laravel's own Redis driver ends its worker the same way.
        $this->assertSame(128 + SIGKILL, $this->timeoutExitUnderLaravelsRedisDriver());
    }

    public function testJobPastTheWorkersTimeoutComesBackAsItsNextAttemptInAnotherWorker(): void
    {
        $this->app->mustRun(['queue:failed-table']);
        $this->app->mustRun(['migrate', '--force']);
        // SlowJob: $tries = 3, its first attempt sleeps 600 s; the limit is queue:work's --timeout.
        $this->dispatch(['SlowJob', 'refund-4']);
        $args = ['queue:work', '--sleep=1', '--timeout=4', '--tries=3'];
        // Two workers at once: the idle one must not get the job while the other runs it,
        // though it runs past retry_after (2 s, the lease, renewed while the job runs).
        $workers = [$this->app->start($args), $this->app->start($args)];
        wait_for(30, 'the first attempt to start', fn () => count($this->app->runs()) === 1);
        $first = $this->app->runs()[0]['pid'];
        $this->assertContains($first, $workers);
        $second = $workers[0] === $first ? $workers[1] : $workers[0];
        $this->assertNoStopSignalBlocked($first);
        $this->assertSame(128 + SIGKILL, $this->app->waitFor($first, 25), $this->app->output());
        $killed = microtime(true);
        $this->assertLessThan($this->app->runs()[0]['at'] + 4 + 4, $killed, 'killed at its timeout');
        $this->assertSame([], $this->app->failedJobs(), 'attempt 1 of 3: not failed');

        // Once the dead worker's lease has passed, the job comes back to the other one.
        wait_for(30, 'the second attempt to finish', fn () => count($this->app->runs()) === 3);
        $this->drainThenStop($second);

        $runs = $this->app->runs();
        $this->assertSame(['started', 'started', 'ran'], array_column($runs, 'event'));
        $this->assertSame([1, 2, 2], array_column($runs, 'attempt'));
        $this->assertSame([$first, $second, $second], array_column($runs, 'pid'));
        $this->assertGreaterThan($killed - 0.1, $runs[1]['at'], 'attempt 2 began after attempt 1 was killed');
        $this->assertSame([], $this->app->failedJobs());
        $this->assertSame([], $this->queue()->deadLetters());
        $this->assertSame(1, $this->queue()->stats()['acked']);
    }

    /** @dataProvider connectionAtBoot */
    public function testDelayedJobStartsOnTimeUnderALongWorkerSleep(array $env): void
    {
        $due = $this->dispatch(['RecordRun', 'remind-6', '--delay=3']);
        // An empty pop() makes queue:work sleep 10 s: the job due meanwhile must not wait for its end.
        $worker = $this->app->start(['queue:work', '--sleep=10'], $env);
        wait_for(30, 'the job to run', fn () => count($this->app->runs()) === 1);
        $this->drainThenStop($worker);

        $at = $this->app->runs()[0]['at'];
        $this->assertGreaterThanOrEqual($due - 0.01, $at, 'not before its due time');
        $this->assertLessThan($due + 2.5, $at, 'started within about a second of its due time, not after the 10 s sleep');
    }

    public static function connectionAtBoot(): array
    {
        return [
            'connection made by queue:work' => [[]],
            'connection made at boot, before queue:work starts' => [['DELAYQ_TEST_QUEUE_AT_BOOT' => '1']],
        ];
    }

    public function testQueueWorkWorksEachQueueOfItsList(): void
    {
        $this->dispatch(['RecordRun', 'on-a', '--queue=a']);
        $this->dispatch(['RecordRun', 'on-b', '--queue=b']);
        $worker = $this->app->start(['queue:work', '--sleep=1', '--queue=a,b']);
        wait_for(30, 'both jobs to run', fn () => count($this->app->runs()) === 2);
        $this->dispatch(['RecordRun', 'on-b-later', '--queue=b', '--delay=1']);
        wait_for(30, 'the delayed job on b to run', fn () => count($this->app->runs()) === 3);
        posix_kill($worker, SIGTERM);
        $this->assertSame(0, $this->app->waitFor($worker, 30), $this->app->output());

        $this->assertSame(['on-a', 'on-b', 'on-b-later'], array_column($this->app->runs(), 'label'));
        foreach (['a' => 1, 'b' => 2] as $name => $acked) {
            $stats = (new DelayQueue($this->redis->url(), $name))->stats();
            $this->assertSame($acked, $stats['acked'], "queue $name");
            $this->assertSame(0, $stats['scheduled'] + $stats['ready'] + $stats['inflight'], "queue $name");
        }
    }

    public function testReleaseForARetryKeepsTheExceptionAsTheMessagesError(): void
    {
        // SlowRetryJob: throws 'payment provider down', $tries = 3, $backoff = 30.
        $this->dispatch(['SlowRetryJob', 'charge-8']);
        $worker = $this->app->start(['queue:work', '--sleep=1']);
        wait_for(30, 'the first attempt to fail', fn () => count($this->app->runs()) === 1);
        $id = $this->app->runs()[0]['job_id'];
        wait_for(10, 'the release', fn () => $this->queue()->stats()['scheduled'] === 1);
        posix_kill($worker, SIGTERM);
        $this->assertSame(0, $this->app->waitFor($worker, 30), $this->app->output());

        $message = $this->queue()->get($id);
        $this->assertNotNull($message);
        $this->assertSame('scheduled', $message['state']);
        $this->assertStringContainsString('RuntimeException: payment provider down for charge-8', (string) $message['last_error']);
        $this->assertGreaterThan(microtime(true) + 20, $message['due_at'], 'waits for its 30 s backoff');
    }

    public function testRedisDownUnderQueueWorkIsReportedAsWithLaravelsRedisDriver(): void
    {
        // Long enough for the pool's idle look (idle_check, 5 s) to meet the outage, then
        // for several pops to report it, even on a loaded machine.
        $outage = 20;
        foreach (['delayq', 'redis'] as $connection) {
            $seen[$connection] = $this->redisOutage($connection, $outage);
        }
        foreach ($seen as $connection => [$running, $reports, $warnings, $recovered]) {
            // Neither "connection to Redis lost" nor phpredis's "Connection lost" or "Connection
            // refused" is a lost connection to Laravel (DetectsLostConnections): its worker
            // stays up and reports the exception of each failed pop, then sleeps.
            $this->assertTrue($running, "$connection: the worker stays up while Redis is down");
            $this->assertGreaterThanOrEqual(2, $reports, "$connection: Laravel reports the pop's exception");
            $this->assertLessThanOrEqual($outage, $reports, "$connection: once per pop, not in a spin");
            $this->assertLessThanOrEqual($outage, $warnings, "$connection: no stream of warnings");
            $this->assertTrue($recovered, "$connection: jobs run again once Redis is back");
        }
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

        // No default address: it could be another Redis than the one meant.
        foreach (['unset' => null, 'empty' => ''] as $case => $url) {
            [$code, $out, $err] = $this->app->artisan(['list'], ['DELAYQ_URL' => $url]);
            $this->assertNotSame(0, $code, "DELAYQ_URL $case");
            $this->assertStringContainsString('queue connection [delayq]', $out . $err, "DELAYQ_URL $case");
            $this->assertStringContainsString("'url' is not set", $out . $err, "DELAYQ_URL $case");
        }

        $this->assertSame(0, $this->app->artisan(['list'])[0], 'the same application boots with a good configuration');
    }

    /** While a job runs, Laravel's stop and timeout signals must reach its worker. */
    private function assertNoStopSignalBlocked(int $pid): void
    {
        $status = (string) file_get_contents("/proc/$pid/status");
        $this->assertSame(1, preg_match('/^SigBlk:\s*([0-9a-f]+)$/m', $status, $m), $status);
        $blocked = hexdec($m[1]);
        foreach (['SIGTERM' => SIGTERM, 'SIGINT' => SIGINT, 'SIGALRM' => SIGALRM] as $name => $signal) {
            $this->assertSame(0, $blocked & (1 << ($signal - 1)), "$name is not blocked (SigBlk: {$m[1]})");
        }
    }

    /** How Laravel's own Redis driver's worker ends on TimeoutJob, on this test's Redis. */
    private function timeoutExitUnderLaravelsRedisDriver(): int
    {
        $this->app->mustRun(['app:dispatch', 'TimeoutJob', 'export-10'], ['QUEUE_CONNECTION' => 'redis']);
        $worker = $this->app->start(['queue:work', 'redis', '--sleep=1']);
        wait_for(30, 'the job to start under the redis driver', fn () => count($this->app->runs()) === 3);
        return $this->app->waitFor($worker, 25);
    }

    /**
     * Stops Redis under a running queue:work for $seconds, then starts it again on the same port.
     *
     * @return array{bool, int, int, bool} the worker still runs at the end of the outage,
     *   the exceptions Laravel reported, delayq's warnings, a job pushed after ran
     */
    private function redisOutage(string $connection, int $seconds): array
    {
        $this->redis->stop();
        $this->redis = new RedisServer();
        $app = new LaravelApp($this->redis->url(), ['QUEUE_CONNECTION' => $connection]);
        try {
            $app->mustRun(['app:dispatch', 'RecordRun', "before-$connection"]);
            $worker = $app->start(['queue:work', $connection, '--sleep=1']);
            wait_for(30, "the first job under $connection", fn () => count($app->runs()) === 1);

            $port = $this->redis->port;
            $this->redis->stop();
            sleep($seconds);
            $running = $app->isRunning($worker);
            $output = $app->output();
            $reports = preg_match_all('/\.ERROR: .*(DelayQueueConnectionException|RedisException)/', $output);
            $warnings = substr_count($output, '[delayq warning]');

            $restarted = self::redisServerOn($port);
            $app->mustRun(['app:dispatch', 'RecordRun', "after-$connection"]);
            $recovered = true;
            try {
                wait_for(20, "the job after the outage under $connection", fn () => count($app->runs()) === 2);
            } catch (\RuntimeException) {
                $recovered = false;
            }
            if ($running) {
                posix_kill($worker, SIGTERM);
                $app->waitFor($worker, 30);
            }
            return [$running, $reports, $warnings, $recovered];
        } finally {
            $app->destroy();
            if (isset($restarted)) {
                proc_terminate($restarted, SIGKILL);
                proc_close($restarted);
            }
        }
    }

    /** @return resource a redis-server on $port, as RedisServer starts one */
    private static function redisServerOn(int $port)
    {
        $proc = proc_open(['redis-server', '--port', (string) $port, '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
            '--dir', sys_get_temp_dir()],
            [0 => ['file', '/dev/null', 'r'], 1 => ['file', '/dev/null', 'w'], 2 => ['file', '/dev/null', 'w']], $pipes);
        wait_for(10, "redis-server on port $port", function () use ($port) {
            try {
                return (new DelayQueue("redis://127.0.0.1:$port", 'default'))->ping();
            } catch (\DelayQueueConnectionException) {
                return false;
            }
        });
        return $proc;
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

    /** Once the queue is drained, SIGTERM stops the worker, which exits 0. */
    private function drainThenStop(int $worker): void
    {
        $this->waitUntilDrained();
        posix_kill($worker, SIGTERM);
        $this->assertSame(0, $this->app->waitFor($worker, 30), $this->app->output());
    }

    private function waitUntilDrained(): void
    {
        wait_for(30, 'the queue to drain', function () {
            $s = $this->queue()->stats();
            return $s['scheduled'] + $s['ready'] + $s['inflight'] === 0;
        });
    }
}
