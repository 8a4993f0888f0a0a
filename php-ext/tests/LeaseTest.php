<?php
declare(strict_types=1);

use PHPUnit\Framework\TestCase;

/**
 * The edges of a lease, with worker processes run as a PHP CLI script runs them: a pool
 * frozen past its lease starts none of what it prefetched, and a message that kills its
 * worker takes no other message with it.
 */
final class LeaseTest extends TestCase
{
    private DelayQueue $q;
    private string $log;
    /** @var list<resource> */
    private array $procs = [];

    protected function setUp(): void
    {
        $server = $GLOBALS['DELAYQ_REDIS'];
        $server->redis()->flushAll();
        $this->q = new DelayQueue($server->url(), 'jobs');
        $this->log = tempnam(sys_get_temp_dir(), 'delayq-lease-');
        unlink($this->log);
    }

    protected function tearDown(): void
    {
        foreach ($this->procs as $proc) {
            $status = proc_get_status($proc);
            if ($status['running']) {
                posix_kill($status['pid'], SIGCONT);
                proc_terminate($proc, SIGKILL);
            }
            proc_close($proc);
        }
        @unlink($this->log);
        @unlink("{$this->log}.stderr");
    }

    /** @return resource */
    private function startWorker(array $options)
    {
        $cmd = array_merge(delayq_php_command(), [__DIR__ . '/lease_worker.php', $GLOBALS['DELAYQ_REDIS']->url(),
            'jobs', $this->log, json_encode($options)]);
        $proc = proc_open($cmd, [0 => ['file', '/dev/null', 'r'], 1 => ['file', '/dev/null', 'w'],
            2 => ['file', "{$this->log}.stderr", 'a']], $pipes);
        $this->assertIsResource($proc);
        $this->procs[] = $proc;
        return $proc;
    }

    /** @return list<array{0: int, 1: int, 2: int, 3: float}> n, attempt, pid, start */
    private function runs(): array
    {
        $lines = @file($this->log, FILE_IGNORE_NEW_LINES | FILE_SKIP_EMPTY_LINES) ?: [];
        return array_map(function ($l) {
            [$n, $attempt, $pid, $start] = explode(' ', $l);
            return [(int) $n, (int) $attempt, (int) $pid, (float) $start];
        }, $lines);
    }

    private function drained(): bool
    {
        $s = $this->q->stats();
        return $s['ready'] + $s['scheduled'] + $s['inflight'] === 0;
    }

    private function stopAll(): void
    {
        foreach ($this->procs as $proc) {
            $status = proc_get_status($proc);
            if ($status['running']) {
                posix_kill($status['pid'], SIGTERM);
            }
        }
        delayq_wait_for(20, 'the workers to stop', function () {
            foreach ($this->procs as $proc) {
                if (proc_get_status($proc)['running']) {
                    return false;
                }
            }
            return true;
        });
    }

    public function testAPoolFrozenPastItsLeaseStartsNoneOfItsPrefetchedDeliveries(): void
    {
        $items = [];
        for ($i = 0; $i < 3000; $i++) {
            $items[] = ['payload' => ['n' => $i]];
        }
        $this->q->pushMany($items);
        $options = ['lease' => 1.0, 'batch' => 20, 'prefetch' => 20, '_sleep_ms' => 2];
        $frozen = proc_get_status($this->startWorker($options))['pid'];
        delayq_wait_for(20, 'a full prefetch', fn () => count($this->runs()) >= 100
            && $this->q->stats()['inflight'] >= 10);
        // A VM pause or a long GC: longer than the lease, while another pool goes on.
        posix_kill($frozen, SIGSTOP);
        $this->startWorker($options);
        sleep(3);
        $resumed = microtime(true);
        posix_kill($frozen, SIGCONT);
        delayq_wait_for(60, 'the queue to drain', fn () => $this->drained());
        $this->stopAll();

        $runs = $this->runs();
        $elsewhere = [];
        foreach ($runs as [$n, , $pid]) {
            if ($pid !== $frozen) {
                $elsewhere[$n] = true;
            }
        }
        $this->assertNotEmpty($elsewhere, 'the other pool ran messages');
        $twice = [];
        foreach ($runs as [$n, , $pid, $start]) {
            if ($pid === $frozen && $start >= $resumed && isset($elsewhere[$n])) {
                $twice[] = $n;
            }
        }
        $this->assertSame([], $twice, 'started by the frozen pool after their lease passed to the other');
        $this->assertSame(3000, count(array_unique(array_column($runs, 0))), 'every message ran');
    }

    public function testAPoisonMessageTakesNoOtherWithItWhenItsWorkerIsRestartedAfterEachDeath(): void
    {
        $items = [];
        for ($i = 0; $i < 31; $i++) {
            $items[] = ['payload' => ['n' => $i, 'kill' => $i === 7], 'id' => "m$i"];
        }
        $this->q->pushMany($items);
        $options = ['lease' => 1.0, 'max_attempts' => 3, '_sleep_ms' => 20];
        // Started again after each death, as systemd or supervisord would.
        $deadline = microtime(true) + 90;
        $proc = $this->startWorker($options);
        $starts = 1;
        while (!$this->drained()) {
            $this->assertLessThan($deadline, microtime(true), "not drained after $starts starts");
            if (!proc_get_status($proc)['running']) {
                $proc = $this->startWorker($options);
                $starts++;
            }
            usleep(20000);
        }
        $this->stopAll();

        $dead = array_column($this->q->deadLetters(), 'id');
        $this->assertSame(['m7'], $dead, 'the poison alone is buried');
        $first = [];
        foreach ($this->runs() as [$n, $attempt]) {
            $first[$n] ??= $attempt;
        }
        $others = array_diff_key($first, [7 => true]);
        $this->assertCount(30, $others, 'every other message ran');
        $this->assertSame(array_fill_keys(array_keys($others), 1), $others, 'each other first ran as attempt 1');
        $this->assertSame(30, $this->q->stats()['acked']);
    }
}
