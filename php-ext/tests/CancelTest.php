<?php
declare(strict_types=1);

use PHPUnit\Framework\TestCase;

/**
 * DelayQueue::cancel() of a message that runs, through the extension: its options,
 * $msg->isCancelled() in a handler and in a consumer's message, and the message ending
 * as cancelled whatever the handler does (the policy is the core's, tested in
 * core/tests/cancel_running.rs).
 */
final class CancelTest extends TestCase
{
    private DelayQueue $q;

    protected function setUp(): void
    {
        $server = $GLOBALS['DELAYQ_REDIS'];
        $server->redis()->flushAll();
        $this->q = new DelayQueue($server->url(), 'jobs');
    }

    private static function waitCancelled(DelayQueueMessage $m): bool
    {
        $deadline = microtime(true) + 5;
        while (!$m->isCancelled() && microtime(true) < $deadline) {
            usleep(2000);
        }
        return $m->isCancelled();
    }

    public function testAHandlerSeesTheCancelAndItsExceptionIsNotRetried(): void
    {
        $this->q->push(['n' => 1], 0, ['id' => 'o-1']);
        $seen = [];
        $w = new DelayQueueWorker($this->q, ['lease' => 0.6, 'stop_when_empty' => true, 'max_attempts' => 5]);
        $summary = $w->run(function (array $payload, DelayQueueMessage $m) use (&$seen) {
            $seen[] = $m->isCancelled();
            // From any process; here the handler's own, through Redis all the same. (An
            // assertion in here would only fail the delivery: the results are checked
            // after the run.)
            $seen[] = $this->q->cancel($m->id);
            $seen[] = self::waitCancelled($m);
            throw new RuntimeException('fails after the cancel');
        });
        $this->assertSame([false, true, true], $seen);
        $this->assertSame([0, 0, 1], [$summary['retried'], $summary['dead'], $summary['cancelled']]);
        $stats = $this->q->stats();
        $this->assertSame([1, 0, 0], [$stats['cancelled'], $stats['retried'], $stats['died']]);
        $this->assertNull($this->q->get('o-1'));
    }

    public function testAConsumersMessageSeesTheCancelAndItsAckDeletesItAsCancelled(): void
    {
        $this->q->push(['n' => 1], 0, ['id' => 'o-1']);
        $c = (new DelayQueueWorker($this->q, ['lease' => 0.6]))->consumer();
        $m = $c->receive(5.0);
        $this->assertNotNull($m);
        $this->assertFalse($m->isCancelled());
        $this->assertFalse($this->q->get('o-1')['cancelled']);
        $this->assertTrue($this->q->cancel('o-1', ['kill' => false]));
        // Read from the mark: before the worker learns of it.
        $info = $this->q->get('o-1');
        $this->assertSame(['inflight', true], [$info['state'], $info['cancelled']]);
        $this->assertTrue(self::waitCancelled($m));
        $m->ack();
        $c->stop();
        $stats = $this->q->stats();
        $this->assertSame([1, 0], [$stats['cancelled'], $stats['acked']]);
    }

    public function testCancelKeepsItsAnswerForWaitingAndUnknownMessages(): void
    {
        $this->q->push(['n' => 1], 60, ['id' => 'later']);
        $this->assertTrue($this->q->cancel('later'));
        $this->assertFalse($this->q->cancel('later'));
        $this->assertFalse($this->q->cancel('nobody', ['kill' => true]));
    }

    public function testCancelOptionsAreCheckedByName(): void
    {
        try {
            $this->q->cancel('x', ['kil' => true]);
            $this->fail('an unknown option is refused');
        } catch (DelayQueueInvalidArgumentException $e) {
            $this->assertStringContainsString("unknown cancel option 'kil'", $e->getMessage());
        }
        try {
            $this->q->cancel('x', ['kill' => 'yes']);
            $this->fail('a kill that is no bool is refused');
        } catch (TypeError $e) {
            // As every option of the wrong type: PHP's own TypeError.
            $this->assertStringContainsString("cancel option 'kill' must be a bool, string given", $e->getMessage());
        }
    }
}
