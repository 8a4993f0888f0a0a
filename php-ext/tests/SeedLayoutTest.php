<?php
declare(strict_types=1);

use PHPUnit\Framework\TestCase;

/** The hand-made recipe (../shared/seeds), written with phpredis as teams run it. */
final class Recipe
{
    public const POP = <<<'LUA'
-- pop_delay.lua
-- KEYS[1] zset key, KEYS[2] payload hash key
-- ARGV[1] now timestamp, ARGV[2] batch size
local zsetKey = KEYS[1]
local hashKey = KEYS[2]
local now = tonumber(ARGV[1])
local batch = tonumber(ARGV[2])
local msgIds = redis.call('ZRANGEBYSCORE', zsetKey, 0, now, 'LIMIT', 0, batch)
local result = {}
for i, msgId in ipairs(msgIds) do
    local removed = redis.call('ZREM', zsetKey, msgId)
    if removed == 1 then
        local payload = redis.call('HGET', hashKey, msgId)
        if payload then
            redis.call('HDEL', hashKey, msgId)
            table.insert(result, msgId)
            table.insert(result, payload)
        end
    end
end
return result
LUA;

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
        $result = $redis->eval(self::POP, ['delay_queue:zset', 'delay_queue:payload', time(), 50], 2);
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
}
