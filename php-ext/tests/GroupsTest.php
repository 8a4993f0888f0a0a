<?php
declare(strict_types=1);

use PHPUnit\Framework\TestCase;

/**
 * Groups through the extension: the push option 'group', setGroupLimit(), $message->group
 * and get()'s 'group' and 'held' (the policy is the core's, tested in core/tests/groups.rs).
 */
final class GroupsTest extends TestCase
{
    private DelayQueue $q;

    protected function setUp(): void
    {
        $server = $GLOBALS['DELAYQ_REDIS'];
        $server->redis()->flushAll();
        $this->q = new DelayQueue($server->url(), 'tenants');
    }

    private function consumer(): DelayQueueConsumer
    {
        return (new DelayQueueWorker($this->q, ['lease' => 30]))->consumer();
    }

    public function testAGroupIsKeptWithTheMessageOfEveryPush(): void
    {
        $pushed = $this->q->push(['n' => 1], 60, ['group' => 'merchant-42']);
        $at = $this->q->pushAt(['n' => 2], microtime(true) + 60, ['group' => 'merchant-42']);
        [$many, $plain] = $this->q->pushMany([
            ['payload' => ['n' => 3], 'delay' => 60, 'group' => 'merchant-7'],
            ['payload' => ['n' => 4], 'delay' => 60],
        ]);
        $groups = array_map(fn ($id) => $this->q->get($id)['group'], [$pushed, $at, $many, $plain]);
        $this->assertSame(['merchant-42', 'merchant-42', 'merchant-7', null], $groups);
        $this->assertNull($this->q->get($pushed)['held'], 'not due: not held');
        $listed = array_column($this->q->waiting(10), 'group', 'id');
        $this->assertSame('merchant-7', $listed[$many]);
    }

    public function testSetGroupLimitSaysWhetherLimitsWereInForce(): void
    {
        $this->assertFalse($this->q->setGroupLimit('merchant-42', 3));
        $this->assertTrue($this->q->setGroupLimit('merchant-42', concurrency: 2, max: 10, per: 60));
        $this->assertTrue($this->q->setGroupLimit('merchant-42'), 'clearing');
        $this->assertFalse($this->q->setGroupLimit('merchant-42'), 'cleared');
        $this->assertFalse($this->q->setGroupLimit(null, max: 5), 'the default');
        $this->assertTrue($this->q->setGroupLimit(null));
    }

    public function testAGroupNeverRunsMoreThanItsLimitAcrossConsumersWhileOthersGoOn(): void
    {
        $this->q->setGroupLimit('merchant-42', 2);
        $items = [];
        for ($n = 0; $n < 5; $n++) {
            $items[] = ['payload' => ['n' => $n], 'delay' => $n / 1000, 'group' => 'merchant-42'];
        }
        $items[] = ['payload' => ['n' => 'other'], 'delay' => 0.01, 'group' => 'merchant-7'];
        $ids = $this->q->pushMany($items);
        usleep(20000);
        $consumers = [$this->consumer(), $this->consumer(), $this->consumer()];
        $running = [];
        $most = 0;
        $done = [];
        $sawHeld = null;
        $deadline = microtime(true) + 30;
        while (count($done) < 6 && microtime(true) < $deadline) {
            // Take whatever the consumers hand out, then end the oldest running one.
            foreach ($consumers as $c) {
                while (($m = $c->receive(0.2)) !== null) {
                    $running[$m->id] = $m;
                }
            }
            $ours = array_filter($running, fn ($m) => $m->group === 'merchant-42');
            $most = max($most, count($ours));
            if ($sawHeld === null && count($ours) === 2) {
                foreach ($ids as $id) {
                    $info = $this->q->get($id);
                    if ($info !== null && $info['held'] !== null) {
                        $sawHeld = $info['held'];
                        break;
                    }
                }
            }
            if ($running === []) {
                continue;
            }
            $first = array_key_first($running);
            $running[$first]->ack();
            $done[$first] = $running[$first]->group;
            unset($running[$first]);
        }
        foreach ($consumers as $c) {
            $c->stop();
        }
        $this->assertCount(6, $done, 'every message ran');
        $this->assertSame(2, $most, 'at most the limit of merchant-42 ran at once');
        $this->assertLessThan(5, array_search('merchant-7', array_values($done), true),
            'merchant-7 ran before the backlog of merchant-42 was through');
        $this->assertSame('group "merchant-42" runs 2 of its concurrency limit of 2', $sawHeld);
        $this->assertSame(0, $this->q->stats()['held']);
    }

    public function testTheHandlerSeesItsMessagesGroup(): void
    {
        $this->q->pushMany([['payload' => 'grouped', 'group' => 'merchant-42'], ['payload' => 'plain']]);
        $groups = [];
        $w = new DelayQueueWorker($this->q, ['stop_when_empty' => true]);
        $summary = $w->run(function ($payload, DelayQueueMessage $m) use (&$groups) {
            $groups[$payload] = $m->group;
        });
        ksort($groups);
        $this->assertSame(['grouped' => 'merchant-42', 'plain' => null], $groups);
        $this->assertSame(2, $summary['acked']);
    }

    public static function badCalls(): array
    {
        return [
            'a group and a serial key' => [
                fn (DelayQueue $q) => $q->push(1, 0, ['group' => 'g', 'serial_key' => 'k']), 'group'],
            'an empty group' => [fn (DelayQueue $q) => $q->push(1, 0, ['group' => '']), 'group'],
            'a pushMany item with both' => [
                fn (DelayQueue $q) => $q->pushMany([['payload' => 1], ['payload' => 2, 'group' => 'g', 'serial_key' => 'k']]),
                'group'],
            'a concurrency of 0' => [fn (DelayQueue $q) => $q->setGroupLimit('g', 0), 'concurrency'],
            'a negative concurrency' => [fn (DelayQueue $q) => $q->setGroupLimit('g', -1), 'concurrency'],
            'a max of 0' => [fn (DelayQueue $q) => $q->setGroupLimit('g', max: 0), 'max'],
            'per without max' => [fn (DelayQueue $q) => $q->setGroupLimit('g', 2, per: 60), 'per'],
            'an empty group limited' => [fn (DelayQueue $q) => $q->setGroupLimit('', 2), 'group'],
        ];
    }

    /** @dataProvider badCalls */
    public function testBadInputIsRefusedNamingItAndWritesNothing(callable $call, string $named): void
    {
        try {
            $call($this->q);
            $this->fail('accepted');
        } catch (DelayQueueInvalidArgumentException $e) {
            $this->assertStringContainsString($named, $e->getMessage());
        }
        $this->assertSame(0, $this->q->stats()['pushed']);
        $this->assertFalse($this->q->setGroupLimit('g'), 'no limits were written');
    }

    public function testTheSeedLayoutRefusesGroups(): void
    {
        $seed = new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'tenants', ['layout' => 'seed']);
        foreach ([fn () => $seed->push(1, 0, ['group' => 'g']), fn () => $seed->setGroupLimit('g', 1)] as $call) {
            try {
                $call();
                $this->fail('accepted');
            } catch (DelayQueueInvalidArgumentException $e) {
                $this->assertStringContainsString('seed layout', $e->getMessage());
            }
        }
    }
}
