<?php

declare(strict_types=1);

namespace Delayq\Tests;

use Delayq\Claimer;
use DelayQueue;
use PHPUnit\Framework\TestCase;

/**
 * Claimer's one-message pools, directly: a claim the framework drops undecided, or still
 * holds when the process ends, is failed back to the queue (a suspended pool's fiber
 * destroyed by PHP would crash the extension).
 */
final class ClaimerTest extends TestCase
{
    private RedisServer $redis;

    protected function setUp(): void
    {
        $this->redis = new RedisServer();
    }

    protected function tearDown(): void
    {
        $this->redis->stop();
    }

    public function testAClaimDroppedUndecidedRunsAgain(): void
    {
        $queue = new DelayQueue($this->redis->url(), 'claims');
        $first = $queue->push(['n' => 1]);
        // A long backoff: the next claim finds nothing due, and the message waits as a retry.
        // Waits up to 2 s for a claim: time for a fresh pool to start on a loaded machine.
        $claimer = new Claimer($queue, ['lease' => 30, 'backoff_base' => 60, 'backoff_max' => 60], 2.0);
        $claim = $claimer->claim();
        $this->assertSame($first, $claim->message->id);
        unset($claim);

        $this->assertNull($claimer->claim(), 'the next claim failed it first, so it is not due now');
        $message = $queue->get($first);
        $this->assertSame('scheduled', $message['state'], 'back in the queue, not held until its 30 s lease ends');
        $this->assertSame(1, $message['attempts']);
        $this->assertStringContainsString('dropped undecided', $message['last_error']);
    }

    public function testAClaimHeldAtExitGoesBackAndTheExitCodeStays(): void
    {
        $queue = new DelayQueue($this->redis->url(), 'claims');
        $id = $queue->push(['n' => 2]);
        $script = '<?php require ' . var_export(__DIR__ . '/autoload.php', true) . ';'
            . '$c = new Delayq\Claimer(new DelayQueue(' . var_export($this->redis->url(), true) . ', "claims"), ["lease" => 30]);'
            . '$held = $c->claim(); echo $held->message->id; exit(3);';
        $file = tempnam(sys_get_temp_dir(), 'delayq-claim') . '.php';
        file_put_contents($file, $script);
        exec(implode(' ', array_map('escapeshellarg', array_merge(php_command(), [$file]))) . ' 2>/dev/null', $out, $code);
        unlink($file);

        $this->assertSame(3, $code, 'exit() keeps its code (no crash at shutdown)');
        $this->assertSame([$id], $out);
        $message = $queue->get($id);
        $this->assertSame('scheduled', $message['state'], 'back in the queue, not waiting for its 30 s lease');
        $this->assertStringContainsString('process ended with the delivery undecided', $message['last_error']);
    }
}
