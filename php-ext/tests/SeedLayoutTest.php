<?php
declare(strict_types=1);

use PHPUnit\Framework\TestCase;

/** The hand-made recipe (../shared/seeds), written with phpredis as teams run it; its
 * pop_delay.lua is tests/fixtures/pop_delay.lua, word for word. */
final class Recipe
{

    public static function push(Redis $redis, array $payload, int $delaySeconds): string
    {
        $msgId = uniqid('msg_', true);
        $expireAt = time() + $delaySeconds;
        $redis->hSet('delay_queue:payload', $msgId, json_encode($payload, JSON_UNESCAPED_UNICODE));
        $redis->zAdd('delay_queue:zset', $expireAt, $msgId);
        return $msgId;
    }

    /** @return array<string, mixed> id => payload */
    public static function pop(Redis $redis): array
    {
        $pop = file_get_contents(dirname(__DIR__, 2) . '/tests/fixtures/pop_delay.lua');
        $result = $redis->eval($pop, ['delay_queue:zset', 'delay_queue:payload', time(), 50], 2);
        $out = [];
        for ($i = 0; $i < count($result); $i += 2) {
            $out[$result[$i]] = json_decode($result[$i + 1], true);
        }
        return $out;
    }
}

final class SeedLayoutTest extends TestCase
{
    private DelayQueue $q;
    private Redis $redis;

    protected function setUp(): void
    {
        $this->redis = $GLOBALS['DELAYQ_REDIS']->redis();
        $this->redis->flushAll();
        $this->q = new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'ignored', ['layout' => 'seed']);
    }

    public function testTheRecipesConsumerTakesWhatDelayqPushes(): void
    {
        $ids = [];
        for ($i = 0; $i < 10; $i++) {
            $ids[] = $this->q->push(['order_id' => 10000 + $i, 'action' => 'close', 'note' => '日本']);
        }
        $this->assertSame(10, $this->redis->hLen('delay_queue:payload'));
        $popped = [];
        // delayq rounds due times up to the next whole second: never early.
        delayq_wait_for(3, 'the recipe to pop all', function () use (&$popped) {
            $popped += Recipe::pop($this->redis);
            return count($popped) === 10;
        });
        $this->assertSame($ids, array_keys($popped));
        $this->assertSame(['order_id' => 10000, 'action' => 'close', 'note' => '日本'], $popped[$ids[0]]);
    }

    public function testDelayqConsumesWhatTheRecipesProducerPushed(): void
    {
        $ids = [];
        for ($i = 0; $i < 10; $i++) {
            $ids[] = Recipe::push($this->redis, ['order_id' => 10000 + $i, 'action' => 'close'], 0);
        }
        $this->assertSame('ready', $this->q->get($ids[0])['state']);
        $got = [];
        $w = new DelayQueueWorker($this->q);
        $w->run(function ($payload, DelayQueueMessage $m) use (&$got, $w) {
            $got[$m->id] = $payload;
            if (count($got) === 10) {
                $w->stop();
            }
        });
        ksort($got);
        sort($ids);
        $this->assertSame($ids, array_keys($got));
        $this->assertSame(['order_id' => 10000, 'action' => 'close'], $got[$ids[0]]);
        // Acknowledged messages leave nothing in the recipe's keys (its HLEN/ZCARD check).
        $this->assertSame(0, $this->redis->hLen('delay_queue:payload'));
        $this->assertSame(0, $this->redis->zCard('delay_queue:zset'));
    }

    public function testCustomKeyNames(): void
    {
        $q = new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'x', ['layout' => 'seed', 'zset_key' => 'app:z', 'payload_key' => 'app:h']);
        $id = $q->push(['a' => 1]);
        $this->assertSame('{"a":1}', $this->redis->hGet('app:h', $id));
        $this->assertNotFalse($this->redis->zScore('app:z', $id));
    }

    public function testMoveWaitingLeavesTheSeedLayoutKeepingIdsPayloadsAndDueTimes(): void
    {
        $later = Recipe::push($this->redis, ['order_id' => 1, 'action' => 'close'], 1800);
        $now = Recipe::push($this->redis, ['order_id' => 2, 'action' => 'close'], 0);
        $due = (int) $this->redis->zScore('delay_queue:zset', $later);
        $native = new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'orders');

        $this->assertSame(2, $this->q->moveWaiting($native));

        $this->assertSame([0, 0], [$this->redis->zCard('delay_queue:zset'), $this->redis->hLen('delay_queue:payload')]);
        $moved = $native->get($later);
        $this->assertSame(['scheduled', ['order_id' => 1, 'action' => 'close'], $due * 1000],
            [$moved['state'], $moved['payload'], (int) round($moved['due_at'] * 1000)]);
        $this->assertSame('ready', $native->get($now)['state']);
        $this->assertSame(2, $this->q->stats()['moved']);
        $this->assertSame(0, $this->q->moveWaiting($native), 'nothing left to move');
    }

    public function testMoveWaitingRefusesWhatTheTargetCannotHoldAndMovesNothing(): void
    {
        $native = new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'orders');
        $id = $native->push(['remind' => 1], 60, ['expire_after' => 30]);
        try {
            $native->moveWaiting($this->q);
            $this->fail('the seed layout has no room for a deadline');
        } catch (DelayQueueInvalidArgumentException $e) {
            $this->assertStringContainsString(json_encode($id), $e->getMessage());
        }
        $this->assertSame('scheduled', $native->get($id)['state']);
        $this->assertSame(0, $this->redis->zCard('delay_queue:zset'));
    }
}
