<?php
declare(strict_types=1);

use PHPUnit\Framework\TestCase;

/**
 * DelayQueueConsumer: the pull consumer that frameworks' workers drive. Each decision
 * is written before the call returns (checked from another connection at once), a
 * signal for PHP's handlers ends a wait, and a Redis that cannot be reached is
 * reported by receive().
 */
final class ConsumerTest extends TestCase
{
    private DelayQueue $q;

    protected function setUp(): void
    {
        $server = $GLOBALS['DELAYQ_REDIS'];
        $server->redis()->flushAll();
        $this->q = new DelayQueue($server->url(), 'pull');
    }

    private function consumer(array $options = []): DelayQueueConsumer
    {
        return (new DelayQueueWorker($this->q, $options + ['lease' => 30, 'max_attempts' => 3]))->consumer();
    }

    public function testEachDecisionIsWrittenBeforeItReturns(): void
    {
        $ids = [];
        foreach (['ack', 'fail', 'retry', 'dead', 'release'] as $i => $what) {
            // One millisecond apart: they come in this order.
            $ids[$what] = $this->q->push(['what' => $what, 'n' => $i], 0);
            usleep(2000);
        }
        // A failed message waits a minute: the released one is the next to come.
        $c = $this->consumer(['backoff_base' => 60]);
        $taken = [];
        foreach ($ids as $what => $id) {
            $m = $c->receive(5.0);
            $this->assertInstanceOf(DelayQueueMessage::class, $m);
            $this->assertSame($id, $m->id);
            $this->assertSame(['what' => $what, 'n' => count($taken)], $m->payload);
            $this->assertSame(1, $m->attempt);
            $this->assertSame('pull', $m->queue);
            $taken[$what] = $m;
            $other = new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'pull');
            switch ($what) {
                case 'ack':
                    $m->ack();
                    $this->assertNull($other->get($id), 'deleted when ack() returned');
                    break;
                case 'fail':
                    $m->fail('card declined');
                    $got = $other->get($id);
                    $this->assertSame('scheduled', $got['state']);
                    $this->assertSame('card declined', $got['last_error']);
                    break;
                case 'retry':
                    $m->retryLater(60, 'partner rate limit');
                    $got = $other->get($id);
                    $this->assertSame('partner rate limit', $got['last_error']);
                    $this->assertGreaterThan(microtime(true) + 50, $got['due_at']);
                    break;
                case 'dead':
                    $m->deadLetter('order 7 no longer exists');
                    $this->assertSame('dead', $other->get($id)['state']);
                    break;
                case 'release':
                    $m->release();
                    // Due at once: the pool may have taken it again already.
                    $this->assertNull($other->get($id)['last_error']);
                    break;
            }
        }
        // The released message comes back at once, its release not counted as an attempt.
        $again = $c->receive(5.0);
        $this->assertSame($ids['release'], $again->id);
        $this->assertSame(1, $again->attempt);
        $again->ack();

        $e = $this->thrown(fn () => $taken['ack']->ack());
        $this->assertInstanceOf(DelayQueueInvalidArgumentException::class, $e);
        $this->assertStringContainsString('was decided already', $e->getMessage());
        $summary = $c->stop();
        $this->assertSame(2, $summary['acked']);
        $this->assertSame('stop', $summary['stopped_by']);
    }

    public function testAMessageDroppedUndecidedFailsAndComesBackCounted(): void
    {
        $id = $this->q->push(['order' => 9], 0);
        $c = $this->consumer(['backoff_base' => 0.1, 'backoff_max' => 0.1]);
        $m = $c->receive(5.0);
        $this->assertSame($id, $m->id);
        unset($m);
        $again = $c->receive(5.0);
        $this->assertSame($id, $again->id);
        $this->assertSame(2, $again->attempt);
        $this->assertStringContainsString('dropped undecided', (string) $this->q->get($id)['last_error']);
        $again->ack();
    }

    public function testWhatBelongsToRunAndWhatBelongsToAConsumerIsRefusedByName(): void
    {
        $e = $this->thrown(fn () => $this->consumer(['timeout' => 5, 'max_jobs' => 3]));
        $this->assertInstanceOf(DelayQueueInvalidArgumentException::class, $e);
        $this->assertStringContainsString("option 'timeout', 'max_jobs' applies to run() only", $e->getMessage());

        $this->q->push('x', 0);
        $worker = new DelayQueueWorker($this->q, ['stop_when_empty' => true]);
        $inside = null;
        $worker->run(function ($payload, DelayQueueMessage $m) use (&$inside) {
            $inside = $this->thrown(fn () => $m->ack());
        });
        $this->assertInstanceOf(DelayQueueInvalidArgumentException::class, $inside);
        $this->assertStringContainsString('inside a DelayQueueWorker handler, return to acknowledge', $inside->getMessage());

        $c = $this->consumer();
        $this->assertStringContainsString('timeout must be 0 or more seconds, got -1',
            $this->thrown(fn () => $c->receive(-1))->getMessage());
        $this->q->push('y', 0);
        $m = $c->receive(5.0);
        $c->stop();
        $this->assertTrue($c->isStopped());
        $this->assertStringContainsString('its DelayQueueConsumer was stopped', $this->thrown(fn () => $m->ack())->getMessage());
        $this->assertStringContainsString('this DelayQueueConsumer was stopped', $this->thrown(fn () => $c->receive(0))->getMessage());
    }

    public function testASignalForPhpEndsTheWaitAndReachesThePhpThread(): void
    {
        $c = $this->consumer();
        // The pool's threads block SIGALRM, SIGTERM and SIGINT: none of them takes a
        // signal meant for PHP's handlers. They start, and name themselves, in the
        // background: read them once their list stops changing.
        $named = function (): array {
            $found = [];
            foreach (glob('/proc/self/task/*/status') as $status) {
                $text = (string) @file_get_contents($status);
                if (preg_match('/^Name:\s+delayq-/m', $text)) {
                    $found[$status] = $text;
                }
            }
            return $found;
        };
        $deadline = microtime(true) + 10;
        do {
            $before = array_keys($named());
            usleep(100000);
            $threads = $named();
        } while (($before === [] || $before !== array_keys($threads)) && microtime(true) < $deadline);
        $pool = 0;
        foreach ($threads as $status => $text) {
            $pool++;
            preg_match('/^SigBlk:\s+([0-9a-f]+)$/m', $text, $m);
            $blocked = (int) hexdec(substr($m[1], -8));
            foreach ([SIGALRM, SIGTERM, SIGINT] as $signal) {
                $this->assertNotSame(0, $blocked & (1 << ($signal - 1)), "$status blocks signal $signal");
            }
        }
        $this->assertGreaterThan(0, $pool, 'the pool has threads named delayq-*');
        pcntl_async_signals(true);
        $alarms = 0;
        pcntl_signal(SIGALRM, function () use (&$alarms) {
            $alarms++;
        });
        try {
            pcntl_alarm(1);
            $started = microtime(true);
            $this->assertNull($c->receive(30.0));
            $this->assertLessThan(10.0, microtime(true) - $started, 'the wait ended at the signal');
            $this->assertSame(1, $alarms, "PHP's handler ran as receive() returned");

            // With the pool's threads running, the process's signal still interrupts
            // the PHP thread's sleep(), as a framework's job timeout needs.
            pcntl_alarm(1);
            $left = sleep(20);
            $this->assertGreaterThan(0, $left, 'sleep() was interrupted');
            $this->assertSame(2, $alarms);
        } finally {
            pcntl_alarm(0);
            pcntl_signal(SIGALRM, SIG_DFL);
            pcntl_async_signals(false);
        }
        $c->stop();
    }

    public function testNextDueInSaysWhenTheNextMessageComes(): void
    {
        $c = $this->consumer();
        $this->assertNull($c->receive(0.3));
        $this->q->push('later', 3.0);
        $this->assertNull($c->receive(0.5));
        $next = $c->nextDueIn();
        // No later than that message; a lease that ends sooner may come first.
        $this->assertNotNull($next);
        $this->assertLessThanOrEqual(3.0, $next);
        $m = $c->receive($next + 2.0);
        $this->assertSame('later', $m->payload);
        $m->ack();
        $c->stop();
    }

    public function testReceiveReportsARedisThatCannotBeReached(): void
    {
        $server = new RedisServer();
        $q = new DelayQueue($server->url(), 'down');
        $c = (new DelayQueueWorker($q, ['lease' => 5]))->consumer();
        $this->assertNull($c->receive(0.2));
        $server->stop();
        $thrown = null;
        $deadline = microtime(true) + 20;
        while ($thrown === null && microtime(true) < $deadline) {
            $thrown = $this->thrown(fn () => $c->receive(1.0));
        }
        $this->assertInstanceOf(DelayQueueConnectionException::class, $thrown);
        $c->stop();
    }

    public function testADecisionThatCannotBeWrittenWhileTheLeaseLastsThrows(): void
    {
        $server = new RedisServer();
        $q = new DelayQueue($server->url(), 'down');
        $q->push(['order' => 5], 0);
        $c = (new DelayQueueWorker($q, ['lease' => 1]))->consumer();
        $m = $c->receive(5.0);
        $this->assertNotNull($m);
        $server->stop();
        $e = $this->thrown(fn () => $m->ack());
        $this->assertInstanceOf(DelayQueueConnectionException::class, $e);
        $this->assertStringContainsString('the decision was not written to Redis', $e->getMessage());
        $this->assertStringContainsString('runs again after its lease', $e->getMessage());
        $c->stop();
    }

    private function thrown(callable $f): ?Throwable
    {
        try {
            $f();
        } catch (Throwable $e) {
            return $e;
        }
        return null;
    }
}
