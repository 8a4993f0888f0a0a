<?php
// What the core logs is written with error_log() on the PHP thread, at the level
// that the delayq.log_level ini setting picks.
declare(strict_types=1);

use PHPUnit\Framework\TestCase;

final class LoggingTest extends TestCase
{
    private string $errorLog;
    private string $savedErrorLog;
    private string $savedLevel;

    protected function setUp(): void
    {
        $this->errorLog = tempnam(sys_get_temp_dir(), 'delayq-errorlog-');
        $this->savedErrorLog = (string) ini_get('error_log');
        $this->savedLevel = (string) ini_get('delayq.log_level');
        ini_set('error_log', $this->errorLog);
    }

    protected function tearDown(): void
    {
        ini_set('error_log', $this->savedErrorLog);
        ini_set('delayq.log_level', $this->savedLevel);
        @unlink($this->errorLog);
    }

    /** @return list<string> */
    private function logged(string $level): array
    {
        $lines = file($this->errorLog, FILE_IGNORE_NEW_LINES | FILE_SKIP_EMPTY_LINES) ?: [];
        return array_values(array_filter($lines, fn ($l) => str_contains($l, "[delayq $level]")));
    }

    public function testTheLevelIsAnIniSettingThatDefaultsToWarning(): void
    {
        $this->assertSame('warning', ini_get('delayq.log_level'));
        $cmd = array_merge(delayq_php_command(), ['-d', 'delayq.log_level=debug', '--ri', 'delayq']);
        exec(implode(' ', array_map('escapeshellarg', $cmd)), $lines, $status);
        $this->assertSame(0, $status);
        $this->assertContains('delayq support => enabled', $lines);
        $this->assertContains('delayq.log_level => debug', $lines);
    }

    public function testAPoisonMessageIsLoggedAsAnErrorWhileTheWorkerRuns(): void
    {
        $server = $GLOBALS['DELAYQ_REDIS'];
        $redis = $server->redis();
        $redis->flushAll();
        $q = new DelayQueue($server->url(), 'jobs');
        $poison = $q->push(['n' => 1]);
        $redis->hSet('{dq:jobs}:messages', $poison, '{not json');
        // Due after the poison has been dealt with: its handler reads the log.
        $q->push(['n' => 2], 0.5);
        $worker = new DelayQueueWorker($q, []);
        $seenWhileRunning = null;
        $worker->run(function (array $payload) use ($worker, &$seenWhileRunning) {
            $seenWhileRunning = $this->logged('error');
            $worker->stop();
        });
        $this->assertCount(1, $seenWhileRunning, 'written before the worker stopped');
        $this->assertStringContainsString("message $poison is unreadable", $seenWhileRunning[0]);
        $this->assertSame(1, $q->stats()['dead']);
    }

    public function testEachFailedAttemptThatWillBeRetriedIsLoggedOnceAsAWarning(): void
    {
        $server = $GLOBALS['DELAYQ_REDIS'];
        $server->redis()->flushAll();
        $q = new DelayQueue($server->url(), 'jobs');
        $ids = [$q->push(['n' => 1]), $q->push(['n' => 2])];
        $worker = new DelayQueueWorker($q, ['backoff_base' => 60]);
        $failed = 0;
        $worker->run(function (array $payload) use ($worker, &$failed) {
            if (++$failed === 2) {
                $worker->stop();
            }
            throw new DomainException("order {$payload['n']} not found");
        });
        $warnings = $this->logged('warning');
        $this->assertCount(2, $warnings, implode("\n", $warnings));
        foreach ([0, 1] as $i) {
            $mine = array_values(array_filter($warnings, fn ($l) => str_contains($l, "message {$ids[$i]} failed")));
            $this->assertCount(1, $mine, implode("\n", $warnings));
            $this->assertMatchesRegularExpression('/\[delayq warning\] delayq\[jobs\]: message ' . $ids[$i]
                . ' failed, retrying in [^:]+: DomainException: order ' . ($i + 1) . ' not found/', $mine[0]);
        }
    }

    public function testControlCharactersOfAnErrorAreEscapedInTheLog(): void
    {
        $server = $GLOBALS['DELAYQ_REDIS'];
        $server->redis()->flushAll();
        $q = new DelayQueue($server->url(), 'jobs');
        $id = $q->push(['n' => 1]);
        $worker = new DelayQueueWorker($q, ['backoff_base' => 60]);
        $worker->run(function () use ($worker) {
            $worker->stop();
            throw new DomainException("\e[2J\e[31mforged\n[delayq warning] all good\u{202e}");
        });
        $warnings = $this->logged('warning');
        $this->assertCount(1, $warnings, implode("\n", $warnings));
        $this->assertStringContainsString("message $id failed", $warnings[0]);
        $this->assertStringContainsString('\x1b[2J\x1b[31mforged\x0a[delayq warning] all good\u202e', $warnings[0]);
        $this->assertStringNotContainsString("\e", $warnings[0]);
    }

    public function testAnEvictingRedisIsReportedOnceAsAWarning(): void
    {
        $evicting = new RedisServer(['--maxmemory-policy', 'allkeys-lru']);
        try {
            $q = new DelayQueue($evicting->url(), 'jobs');
            $q->push(['n' => 1]);
            $q->push(['n' => 2]);
            $warnings = $this->logged('warning');
            $this->assertCount(1, $warnings, implode("\n", $warnings));
            $this->assertStringContainsString('maxmemory-policy is allkeys-lru', $warnings[0]);
        } finally {
            $evicting->stop();
        }
    }

    public function testTheIniLevelDecidesWhatIsWritten(): void
    {
        $gone = new RedisServer();
        $url = $gone->url();
        $gone->stop();
        $options = ['retry_timeout' => 0.3, 'connect_timeout' => 0.1];

        ini_set('delayq.log_level', 'debug');
        $q = new DelayQueue($url, 'jobs', $options);
        try {
            $q->push(['n' => 1]);
            $this->fail('pushed to a stopped Redis');
        } catch (DelayQueueConnectionException $e) {
        }
        $debug = $this->logged('debug');
        $this->assertNotEmpty($debug);
        $this->assertStringContainsString('retrying in', $debug[0]);

        ini_set('delayq.log_level', 'off');
        $q = new DelayQueue($url, 'jobs', $options);
        try {
            $q->push(['n' => 1]);
            $this->fail('pushed to a stopped Redis');
        } catch (DelayQueueConnectionException $e) {
        }
        $this->assertSame($debug, $this->logged('debug'), 'nothing more at level off');

        ini_set('delayq.log_level', 'loud');
        new DelayQueue($url, 'jobs', $options);
        $warnings = $this->logged('warning');
        $this->assertCount(1, $warnings);
        $this->assertStringContainsString('delayq.log_level = "loud" is not a level', $warnings[0]);
    }
}
