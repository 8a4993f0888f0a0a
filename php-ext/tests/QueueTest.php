<?php
declare(strict_types=1);

use PHPUnit\Framework\TestCase;

final class Order implements JsonSerializable
{
    public function __construct(private int $id) {}

    public function jsonSerialize(): array
    {
        return ['order_id' => $this->id, 'action' => 'close'];
    }
}

final class SelfSerializing implements JsonSerializable
{
    public function jsonSerialize(): mixed
    {
        return $this;
    }
}

final class QueueTest extends TestCase
{
    private DelayQueue $q;
    private Redis $redis;

    protected function setUp(): void
    {
        $server = $GLOBALS['DELAYQ_REDIS'];
        $this->redis = $server->redis();
        $this->redis->flushAll();
        $this->q = new DelayQueue($server->url(), 'orders');
    }

    private function serverNow(): float
    {
        [$s, $us] = $this->redis->time();
        return (int) $s + (int) $us / 1e6;
    }

    public function testPushAndGetRoundTripPayloadsExactly(): void
    {
        $payload = ['order_id' => 10086, 'big' => PHP_INT_MAX, 'neg' => PHP_INT_MIN, 'u' => '日本語 ✓',
            'map' => ['z' => 1, 'a' => [1.5, null, true]], '7' => 'numeric key', 'empty' => []];
        $before = $this->serverNow();
        $id = $this->q->push($payload, 60);
        $info = $this->q->get($id);
        $this->assertSame($id, $info['id']);
        $this->assertSame('scheduled', $info['state']);
        $this->assertSame($payload, $info['payload']);
        $this->assertSame(array_keys($payload), array_keys($info['payload']), 'key order survives');
        // Due times have millisecond grain: the push may run in the very millisecond
        // whose start is up to 1 ms before the microsecond clock read above.
        $this->assertGreaterThanOrEqual($before + 60 - 0.001, $info['due_at']);
        $this->assertLessThan($before + 61, $info['due_at']);
        $this->assertSame(0, $info['attempts']);
        $this->assertNull($info['last_error']);
        $this->assertEqualsWithDelta(microtime(true), $info['created_at'], 5.0);
        $this->assertNull($this->q->get('no-such-id'));
    }

    public function testScalarsNullAndJsonSerializablePayloads(): void
    {
        foreach ([null, true, 0, -7, 1.25, 'text', [1, 2, 3]] as $p) {
            $this->assertSame($p, $this->q->get($this->q->push($p))['payload']);
        }
        $this->assertSame(['order_id' => 5, 'action' => 'close'], $this->q->get($this->q->push(new Order(5)))['payload']);
        $obj = new stdClass();
        $obj->a = 1;
        $this->assertSame(['a' => 1], $this->q->get($this->q->push($obj))['payload']);
        $this->assertSame('ready', $this->q->get($this->q->push('now'))['state']);
    }

    public function testPushAtAcceptsUnixSecondsAndDateTimes(): void
    {
        $id = $this->q->pushAt('x', 4102444800.25);
        $this->assertSame(4102444800.25, $this->q->get($id)['due_at']);
        $id = $this->q->pushAt('y', new DateTimeImmutable('2100-01-01 00:00:00.5 UTC'));
        $this->assertSame(4102444800.5, $this->q->get($id)['due_at']);
        $this->assertSame('ready', $this->q->get($this->q->pushAt('past', 1))['state']);
    }

    public function testPushAtDeclaresItsTimeAsFloatOrDateTimeInterface(): void
    {
        // What IDEs and static analysers read: the contract's `float|DateTimeInterface $at`.
        $type = (new ReflectionMethod(DelayQueue::class, 'pushAt'))->getParameters()[1]->getType();
        $this->assertInstanceOf(ReflectionUnionType::class, $type);
        $names = array_map(fn (ReflectionNamedType $t) => $t->getName(), $type->getTypes());
        sort($names);
        $this->assertSame(['DateTimeInterface', 'float'], $names);
        $this->assertFalse($type->allowsNull());
    }

    public function testASerialKeyIsKeptWithTheMessageAndBadOnesAreRefused(): void
    {
        $id = $this->q->push(['order_id' => 10086], 60, ['serial_key' => 'order:10086']);
        $this->assertSame('order:10086', $this->q->get($id)['serial_key']);
        $this->assertNull($this->q->get($this->q->push(['order_id' => 1]))['serial_key']);
        foreach (['', "order\n1", str_repeat('k', 1000)] as $bad) {
            try {
                $this->q->push(['order_id' => 2], 0, ['serial_key' => $bad]);
                $this->fail('accepted serial_key ' . var_export($bad, true));
            } catch (DelayQueueInvalidArgumentException $e) {
                $this->assertStringContainsString('serial_key', $e->getMessage());
            }
        }
        $this->assertSame(2, $this->q->stats()['pushed'], 'nothing written');
    }

    public function testAFullRedisRefusesAPushWithItsOwnExceptionAndWritesNothing(): void
    {
        $server = new RedisServer(['--maxmemory-policy', 'noeviction']);
        try {
            $q = new DelayQueue($server->url(), 'full');
            $q->push(['order_id' => 1]);
            $redis = $server->redis();
            $redis->config('SET', 'maxmemory', (string) intdiv((int) $redis->info('memory')['used_memory'], 2));
            foreach ([[], ['id' => 'close-order-2']] as $options) {
                try {
                    $q->push(['order_id' => 2], 0, $options);
                    $this->fail('a push into a full Redis succeeded');
                } catch (DelayQueueOutOfMemoryException $e) {
                    $this->assertInstanceOf(DelayQueueException::class, $e);
                    $this->assertStringContainsString('out of memory', $e->getMessage());
                    $this->assertStringContainsString('nothing was written', $e->getMessage());
                }
            }
            $stats = $q->stats();
            $this->assertSame([1, 1], [$stats['ready'], $stats['pushed']]);
            $this->assertNull($q->get('close-order-2'));
        } finally {
            $server->stop();
        }
    }

    public function testAStreamedBatchRefusedForMemoryAfterItsFirstScriptNamesTheIdsItWrote(): void
    {
        $server = new RedisServer(['--maxmemory-policy', 'noeviction']);
        try {
            $q = new DelayQueue($server->url(), 'full');
            $redis = $server->redis();
            $items = [];
            for ($i = 0; $i < 2000; $i++) {
                $items[] = ['payload' => ['i' => $i, 'pad' => str_repeat('x', 100)], 'delay' => 60];
            }
            $e = $this->refusedAfterItsFirstScript($q, $redis, $items);
            // Still the class it was, for code that catches that.
            $this->assertInstanceOf(DelayQueueOutOfMemoryException::class, $e);
            $this->assertInstanceOf(DelayQueuePartialPushException::class, $e);
            $this->assertStringContainsString(
                "1000 of the batch's 2000 messages were written and the other 1000 were not",
                $e->getMessage()
            );
            $this->assertStringNotContainsString('nothing was written', $e->getMessage());
            $ids = $e->getIds();
            $this->assertCount(2000, $ids);
            $this->assertSame(array_slice($ids, 0, 1000), $e->getWrittenIds(), "the first script's ids, in order");
            $this->assertSame(1000, $e->getWrittenCount());
            $this->assertSame([], $e->getUnknownIds());
            $stored = $redis->hKeys('{dq:full}:messages');
            sort($stored);
            $written = $e->getWrittenIds();
            sort($written);
            $this->assertSame($written, $stored);
            $this->assertSame(1000, $redis->hLen('{dq:full}:messages'));
            $this->assertSame(['i' => 999, 'pad' => str_repeat('x', 100)], $q->get($e->getWrittenIds()[999])['payload']);
            // The whole batch again under those ids writes the rest, once.
            foreach ($items as $n => &$item) {
                $item['id'] = $ids[$n];
            }
            unset($item);
            $this->assertSame($ids, $q->pushMany($items));
            $this->assertSame(2000, $redis->hLen('{dq:full}:messages'));
        } finally {
            $server->stop();
        }
    }

    /**
     * Pushes $items, two scripts of 1 000, under maxmemory limits until one lets the
     * first script in and refuses the second, and returns that push's exception. Each
     * try starts from an empty server; one that wrote everything had too high a limit,
     * one that wrote nothing too low. Searched for: what a script's arguments take
     * while it runs differs between Redis versions.
     */
    private function refusedAfterItsFirstScript(DelayQueue $q, Redis $redis, array $items): DelayQueueException
    {
        $used = fn (): int => (int) $redis->info('memory')['used_memory'];
        $empty = function () use ($redis): void {
            $redis->config('SET', 'maxmemory', '0');
            $redis->flushAll();
        };
        $q->pushMany(array_slice($items, 0, 10));
        $empty();
        $before = $used();
        $q->pushMany(array_slice($items, 0, 1000));
        $one = $used() - $before;
        $empty();
        [$low, $high] = [$before, $before + 2 * $one];
        for ($try = 0; $try < 30; $try++) {
            $limit = $low + intdiv($high - $low, 2);
            $redis->config('SET', 'maxmemory', (string) $limit);
            $caught = null;
            try {
                $q->pushMany($items);
            } catch (DelayQueueException $e) {
                $caught = $e;
            }
            $redis->config('SET', 'maxmemory', '0');
            $stored = $redis->hLen('{dq:full}:messages');
            if ($caught !== null && $stored === 1000) {
                return $caught;
            }
            if ($caught === null) {
                $high = $limit;
            } elseif ($stored === 0) {
                $this->assertInstanceOf(DelayQueueOutOfMemoryException::class, $caught);
                $low = $limit;
            } else {
                $this->fail("$stored messages stored: " . $caught->getMessage());
            }
            $empty();
        }
        $this->fail("no maxmemory between $low and $high lets one script of the batch in and not the other");
    }

    public function testAPersistentQueueKeepsItsConnectionFromRequestToRequest(): void
    {
        $server = new RedisServer();
        try {
            $inspector = $server->redis();
            $connections = fn (): int => (int) $inspector->info('stats')['total_connections_received'];
            // What a PHP-FPM worker does: a new DelayQueue in every request, gone at its end.
            $requests = function (array $options) use ($server): void {
                for ($i = 0; $i < 20; $i++) {
                    $q = new DelayQueue($server->url(), 'fpm', $options);
                    $q->push(['request' => $i]);
                    unset($q);
                }
            };
            $before = $connections();
            $requests([]);
            $this->assertSame(20, $connections() - $before, 'one connection per request');

            $before = $connections();
            $requests(['persistent' => true]);
            $this->assertSame(1, $connections() - $before, 'one connection for all requests');
            $requests(['persistent' => true]);
            $this->assertSame(1, $connections() - $before, 'still the same connection');

            // Other options, another queue: kept apart.
            $requests(['persistent' => true, 'read_timeout' => 3.0]);
            $this->assertSame(2, $connections() - $before);
            $this->assertSame(80, (new DelayQueue($server->url(), 'fpm'))->stats()['pushed']);
        } finally {
            $server->stop();
        }
    }

    public function testArgumentsFollowPhpsOwnRulesInTheCallersMode(): void
    {
        require_once __DIR__ . '/coercive_calls.php';
        // The default mode coerces as PHP's own functions do.
        $this->assertSame('42', coercively($this->q, 'push', [['v' => 1], '30', ['id' => '42']]));
        $info = coercively($this->q, 'get', [42]);
        $this->assertSame(['v' => 1], $info['payload']);
        $this->assertEqualsWithDelta($this->serverNow() + 30, $info['due_at'], 2.0);
        $this->assertSame([], coercively($this->q, 'deadLetters', ['5']));
        // Values in options arrays too (an int order id, a count read from the environment),
        // except bools: PHP would take any string, and 'false' would be true.
        $this->assertSame('10086', coercively($this->q, 'push', [['v' => 2], 60, ['id' => 10086, 'max_attempts' => '3']]));
        $this->assertSame(3, $this->q->get('10086')['max_attempts']);
        [$at] = coercively($this->q, 'pushMany', [[['payload' => ['v' => 3], 'at' => (string) (time() + 3600)]]]);
        $this->assertEqualsWithDelta(time() + 3600, $this->q->get($at)['due_at'], 2.0);
        $this->assertInstanceOf(DelayQueueWorker::class, coercively_new('DelayQueueWorker', [$this->q, ['processes' => '2']]));
        // Under strict_types (this file) the same calls are refused, in PHP's words.
        $refused = [
            [fn () => $this->q->push(1, '30'), 'DelayQueue::push(): Argument #2 ($delay) must be of type float, string given'],
            [fn () => $this->q->get(42), 'DelayQueue::get(): Argument #1 ($id) must be of type string, int given'],
            [fn () => $this->q->push(1, 0, ['id' => 10086]), "push option 'id' must be a string, int given"],
            [fn () => coercively_new('DelayQueueWorker', [$this->q, ['stop_when_empty' => 'yes']]),
                "DelayQueueWorker option 'stop_when_empty' must be a bool, string given"],
            // What no mode coerces.
            [fn () => coercively($this->q, 'push', [1, 'soon']), 'DelayQueue::push(): Argument #2 ($delay) must be of type float, string given'],
            [fn () => coercively($this->q, 'push', [1, 0, 'x']), 'DelayQueue::push(): Argument #3 ($options) must be of type array, string given'],
            [fn () => coercively($this->q, 'cancel', [null]), 'DelayQueue::cancel(): Argument #1 ($id) must be of type string, null given'],
            [fn () => coercively($this->q, 'pushAt', [1, 'tomorrow']),
                'DelayQueue::pushAt(): Argument #2 ($at) must be of type DateTimeInterface|float, string given'],
            [fn () => coercively_new('DelayQueueWorker', ['orders']),
                'DelayQueueWorker::__construct(): Argument #1 ($queue) must be of type DelayQueue, string given'],
        ];
        foreach ($refused as [$call, $message]) {
            try {
                $call();
                $this->fail("accepted: $message");
            } catch (TypeError $e) {
                $this->assertSame($message, $e->getMessage());
            }
        }
        // An int for a float parameter passes in both modes, as in PHP.
        $this->q->push(4, 60);
        $this->assertSame(4, $this->q->stats()['pushed'], 'a refused call wrote nothing');
    }

    public function testPersistentMustBeABool(): void
    {
        $this->expectException(TypeError::class);
        $this->expectExceptionMessage('persistent');
        new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'orders', ['persistent' => 'yes']);
    }

    public function testAnIdMakesPushIdempotent(): void
    {
        $first = $this->q->push(['v' => 1], 30, ['id' => 'order-42-close', 'max_attempts' => 3]);
        $second = $this->q->push(['v' => 2], 90, ['id' => 'order-42-close']);
        $this->assertSame('order-42-close', $first);
        $this->assertSame($first, $second);
        $info = $this->q->get($first);
        $this->assertSame(['v' => 1], $info['payload']);
        $this->assertSame(3, $info['max_attempts']);
        $this->assertSame(1, $this->q->stats()['pushed']);
    }

    public function testAReplacingPushDebouncesAWaitingMessage(): void
    {
        $this->q->push(['v' => 1], 60, ['id' => 'close-cart-7', 'replace' => true]);
        $this->q->push(['v' => 2], 1800, ['id' => 'close-cart-7', 'replace' => true, 'max_attempts' => 2]);
        $info = $this->q->get('close-cart-7');
        $this->assertSame([['v' => 2], 2], [$info['payload'], $info['max_attempts']]);
        $this->assertGreaterThan(microtime(true) + 1790, $info['due_at'], 'the timer starts again');
        $this->q->push(['v' => 3], 0, ['id' => 'close-cart-7']);
        $this->assertSame(['v' => 2], $this->q->get('close-cart-7')['payload'], 'without replace it is kept');
        $this->q->pushMany([['payload' => ['v' => 4], 'id' => 'close-cart-7', 'replace' => true]]);
        $this->assertSame(['v' => 4], $this->q->get('close-cart-7')['payload']);
        $stats = $this->q->stats();
        $this->assertSame([1, 2, 1], [$stats['pushed'], $stats['replaced'], $stats['ready'] + $stats['scheduled']]);
        try {
            $this->q->push(['v' => 5], 0, ['replace' => true]);
            $this->fail('replace without an id was accepted');
        } catch (DelayQueueInvalidArgumentException $e) {
            $this->assertStringContainsString('replace', $e->getMessage());
        }
        try {
            $this->q->push(['v' => 5], 0, ['id' => 'close-cart-7', 'replace' => 'yes']);
            $this->fail('a string replace was accepted');
        } catch (TypeError $e) {
            $this->assertStringContainsString('replace', $e->getMessage());
        }
        $this->assertSame(['v' => 4], $this->q->get('close-cart-7')['payload'], 'refused pushes wrote nothing');
    }

    public function testPushManyIsOneCallAndKeepsOrder(): void
    {
        $items = [];
        for ($i = 0; $i < 1500; $i++) {
            $items[] = ['payload' => ['i' => $i], 'delay' => 0];
        }
        $items[] = ['payload' => 'later', 'delay' => 3600, 'id' => 'fixed'];
        $items[] = ['payload' => 'at', 'at' => 4102444800];
        $ids = $this->q->pushMany($items);
        $this->assertCount(1502, $ids);
        $this->assertSame('fixed', $ids[1500]);
        $stats = $this->q->stats();
        $this->assertSame(1500, $stats['ready']);
        $this->assertSame(2, $stats['scheduled']);
        $this->assertSame(array_slice($ids, 0, 1500), $this->redis->zRange('{dq:orders}:scheduled', 0, 1499));
    }

    public function testCancelRescheduleAndPurge(): void
    {
        $id = $this->q->push('x', 3600);
        $this->assertTrue($this->q->reschedule($id, 0));
        $this->assertSame('ready', $this->q->get($id)['state']);
        $this->assertTrue($this->q->cancel($id));
        $this->assertFalse($this->q->cancel($id));
        $this->assertFalse($this->q->reschedule($id, 5));
        $this->assertNull($this->q->get($id));
        $this->q->push(1);
        $this->q->push(2, 10);
        $this->assertSame(2, $this->q->purge());
        $this->assertSame(0, $this->q->stats()['ready'] + $this->q->stats()['scheduled']);
    }

    public function testStatsShape(): void
    {
        $stats = $this->q->stats();
        foreach (['scheduled', 'ready', 'inflight', 'dead', 'pushed', 'acked', 'retried', 'died', 'expired'] as $k) {
            $this->assertIsInt($stats[$k], $k);
        }
        $this->assertNull($stats['next_due_at']);
        $this->assertNull($stats['paused_at']);
        $this->assertFalse($this->q->isPaused());
        $this->assertSame('orders', $this->q->name());
        $this->assertTrue($this->q->ping());
    }

    /** @return array<string, array{0: callable, 1: class-string, 2: string}> */
    public static function badInputs(): array
    {
        return [
            'resource' => [fn (DelayQueue $q) => $q->push(fopen('php://memory', 'r')), DelayQueuePayloadException::class, '$payload is a resource'],
            'closure' => [fn (DelayQueue $q) => $q->push(['a' => ['b' => fn () => 1]]), DelayQueuePayloadException::class, '$payload["a"]["b"] is an object: a Closure'],
            'object' => [fn (DelayQueue $q) => $q->push(new ArrayObject()), DelayQueuePayloadException::class, 'ArrayObject'],
            'invalid utf-8' => [fn (DelayQueue $q) => $q->push(['k' => "\xff"]), DelayQueuePayloadException::class, 'not valid UTF-8'],
            'nan in payload' => [fn (DelayQueue $q) => $q->push([NAN]), DelayQueuePayloadException::class, 'NaN'],
            'jsonSerialize returning itself' => [fn (DelayQueue $q) => $q->push(['job' => new SelfSerializing()]), DelayQueuePayloadException::class,
                ' is nested deeper than 128 levels (or contains itself)'],
            'too deep' => [fn (DelayQueue $q) => $q->push(json_decode(str_repeat('[', 200) . str_repeat(']', 200), true, 512)), DelayQueuePayloadException::class, 'nested deeper'],
            'nan delay' => [fn (DelayQueue $q) => $q->push(1, NAN), DelayQueueInvalidArgumentException::class, 'invalid delay'],
            'inf delay' => [fn (DelayQueue $q) => $q->push(1, INF), DelayQueueInvalidArgumentException::class, 'must be finite'],
            'negative delay' => [fn (DelayQueue $q) => $q->push(1, -1), DelayQueueInvalidArgumentException::class, 'must not be negative'],
            'string delay' => [fn (DelayQueue $q) => $q->push(1, 'soon'), TypeError::class, 'delay'],
            'unknown push option' => [fn (DelayQueue $q) => $q->push(1, 0, ['idd' => 'x']), DelayQueueInvalidArgumentException::class, "unknown push option 'idd'"],
            'bad id' => [fn (DelayQueue $q) => $q->push(1, 0, ['id' => '']), DelayQueueInvalidArgumentException::class, 'invalid id'],
            'bad max_attempts' => [fn (DelayQueue $q) => $q->push(1, 0, ['max_attempts' => 0]), DelayQueueInvalidArgumentException::class, 'max_attempts'],
            'bad pushMany item' => [fn (DelayQueue $q) => $q->pushMany([['payload' => 1], ['payload' => 2, 'dleay' => 1]]), DelayQueueInvalidArgumentException::class, "pushMany item 1 key 'dleay'"],
            'bad pushMany payload' => [fn (DelayQueue $q) => $q->pushMany([['payload' => 1], ['payload' => ['a' => NAN]]]), DelayQueuePayloadException::class, 'pushMany item 1 payload["a"] is NaN'],
            'deep path cut' => [fn (DelayQueue $q) => $q->push(json_decode(str_repeat('[', 200) . str_repeat(']', 200), true, 512)), DelayQueuePayloadException::class,
                '$payload' . str_repeat('[0]', 13) . '…' . str_repeat('[0]', 16) . ' is nested deeper'],
            'pushMany without payload' => [fn (DelayQueue $q) => $q->pushMany([['delay' => 1]]), DelayQueueInvalidArgumentException::class, "has no 'payload'"],
            'bad at' => [fn (DelayQueue $q) => $q->pushAt(1, new stdClass()), TypeError::class, 'DateTimeInterface'],
            'string at' => [fn (DelayQueue $q) => $q->pushAt(1, 'tomorrow'), TypeError::class,
                'DelayQueue::pushAt(): Argument #2 ($at) must be of type DateTimeInterface|float, string given'],
            'string at in pushMany' => [fn (DelayQueue $q) => $q->pushMany([['payload' => 1, 'at' => '2100-01-01']]), TypeError::class,
                'or a DateTimeInterface, string given'],
            'bad url' => [fn () => new DelayQueue('http://127.0.0.1'), DelayQueueInvalidArgumentException::class, 'invalid Redis URL'],
            'unknown queue option' => [fn () => new DelayQueue('redis://127.0.0.1:1', 'q', ['prefx' => 'a']), DelayQueueInvalidArgumentException::class, "unknown DelayQueue option 'prefx'"],
            'bad layout' => [fn () => new DelayQueue('redis://127.0.0.1:1', 'q', ['layout' => 'x']), DelayQueueInvalidArgumentException::class,
                "DelayQueue option 'layout' must be 'native' or 'seed', got \"x\""],
            // The bounds are the core's table's, as in Python (test_options.py).
            'dead_max below its range' => [fn () => new DelayQueue('redis://127.0.0.1:1', 'q', ['dead_max' => 0]), DelayQueueInvalidArgumentException::class,
                "DelayQueue option 'dead_max' must be between 1 and 100000000, got 0"],
            'wait_replicas above its range' => [fn () => new DelayQueue('redis://127.0.0.1:1', 'q', ['wait_replicas' => 65]), DelayQueueInvalidArgumentException::class,
                "DelayQueue option 'wait_replicas' must be between 0 and 64, got 65"],
            'keep_completed_for below its range' => [fn () => new DelayQueue('redis://127.0.0.1:1', 'q', ['keep_completed_for' => 0.5]), DelayQueueInvalidArgumentException::class,
                "DelayQueue option 'keep_completed_for' must be at least 1 s, got 0.5"],
            'read_timeout of zero' => [fn () => new DelayQueue('redis://127.0.0.1:1', 'q', ['read_timeout' => 0]), DelayQueueInvalidArgumentException::class,
                "DelayQueue option 'read_timeout' must be above 0 seconds"],
            'zset_key without the seed layout' => [fn () => new DelayQueue('redis://127.0.0.1:1', 'q', ['zset_key' => 'z']), DelayQueueInvalidArgumentException::class,
                "DelayQueue option 'zset_key' applies only with layout 'seed'"],
            'bad queue name' => [fn () => new DelayQueue('redis://127.0.0.1:1', 'a{b'), DelayQueueInvalidArgumentException::class, 'queue name'],
            'bad worker option' => [fn (DelayQueue $q) => new DelayQueueWorker($q, ['batch' => 5000]), DelayQueueInvalidArgumentException::class, "'batch'"],
            'unknown worker option' => [fn (DelayQueue $q) => new DelayQueueWorker($q, ['procs' => 2]), DelayQueueInvalidArgumentException::class, "unknown DelayQueueWorker option 'procs'"],
            'on_start not callable' => [fn (DelayQueue $q) => new DelayQueueWorker($q, ['on_start' => 'no_such_function']), TypeError::class, 'on_start'],
            'stop_when_empty not a bool' => [fn (DelayQueue $q) => new DelayQueueWorker($q, ['stop_when_empty' => 'yes']), TypeError::class, 'stop_when_empty'],
        ];
    }

    // The annotation for PHPUnit 9 (Ubuntu 22.04's, with PHP 8.1), the attribute for 10
    // and later, which deprecate the annotation (see scripts/php-versions.sh).
    /** @dataProvider badInputs */
    #[PHPUnit\Framework\Attributes\DataProvider('badInputs')]
    public function testBadInputIsRefusedWithANamedErrorAndWritesNothing(callable $call, string $class, string $text): void
    {
        try {
            $call($this->q);
            $this->fail("no $class thrown");
        } catch (Throwable $e) {
            $this->assertInstanceOf($class, $e, $e->getMessage());
            $this->assertStringContainsString($text, $e->getMessage());
        }
        $this->assertSame([], $this->redis->keys('*'), 'bad input must write nothing');
    }

    /** @return array<string, array{0: callable, 1: class-string, 2: string}> */
    public static function invalidUtf8Inputs(): array
    {
        $bad = "\xff";
        $url = 'redis://127.0.0.1:1';
        $payload = DelayQueuePayloadException::class;
        $invalid = DelayQueueInvalidArgumentException::class;
        return [
            'payload key' => [fn (DelayQueue $q) => $q->push([$bad => 1]), $payload, '$payload["\xff"]: the array key is not valid UTF-8'],
            'nested payload key' => [fn (DelayQueue $q) => $q->push(['a' => [1, [$bad => 1]]]), $payload, '$payload["a"][1]["\xff"]: the array key is not valid UTF-8'],
            'key after text' => [fn (DelayQueue $q) => $q->push(["ok-\u{e9}-$bad" => 1]), $payload, '$payload["ok-é-\xff"]: the array key is not valid UTF-8 (byte 6)'],
            'stdClass property' => [fn (DelayQueue $q) => $q->push(['o' => (object) [$bad => 1]]), $payload, '$payload["o"]["\xff"]: the array key is not valid UTF-8'],
            'payload value' => [fn (DelayQueue $q) => $q->push(['k' => [$bad]]), $payload, '$payload["k"][0] is not valid UTF-8'],
            'payload string' => [fn (DelayQueue $q) => $q->push($bad), $payload, '$payload is not valid UTF-8'],
            'option id' => [fn (DelayQueue $q) => $q->push(1, 0, ['id' => $bad]), $invalid, "push option 'id' is not valid UTF-8"],
            'option serial_key' => [fn (DelayQueue $q) => $q->push(1, 0, ['serial_key' => $bad]), $invalid, "push option 'serial_key' is not valid UTF-8"],
            'option partition_key' => [fn (DelayQueue $q) => $q->push(1, 0, ['partition_key' => $bad]), $invalid, "push option 'partition_key' is not valid UTF-8"],
            'option name' => [fn (DelayQueue $q) => $q->push(1, 0, [$bad => 1]), $invalid, 'unknown push option "\xff": not valid UTF-8'],
            'pushAt payload key' => [fn (DelayQueue $q) => $q->pushAt([$bad => 1], 4102444800.0), $payload, '$payload["\xff"]: the array key is not valid UTF-8'],
            'pushAt id' => [fn (DelayQueue $q) => $q->pushAt(1, 4102444800.0, ['id' => $bad]), $invalid, "pushAt option 'id' is not valid UTF-8"],
            'pushMany payload key' => [fn (DelayQueue $q) => $q->pushMany([['payload' => 1], ['payload' => [$bad => 1]]]), $payload, 'pushMany item 1 payload["\xff"]: the array key is not valid UTF-8'],
            'pushMany item key' => [fn (DelayQueue $q) => $q->pushMany([['payload' => 1, $bad => 1]]), $invalid, 'unknown pushMany item 0 key "\xff": not valid UTF-8'],
            'pushMany id' => [fn (DelayQueue $q) => $q->pushMany([['payload' => 1, 'id' => $bad]]), $invalid, "pushMany item 0 key 'id' is not valid UTF-8"],
            'pushMany serial_key' => [fn (DelayQueue $q) => $q->pushMany([['payload' => 1, 'serial_key' => $bad]]), $invalid, "pushMany item 0 key 'serial_key' is not valid UTF-8"],
            'repeat name' => [fn (DelayQueue $q) => $q->repeat($bad, 60, 1), $invalid, 'DelayQueue::repeat(): Argument #1 ($name) is not valid UTF-8'],
            'repeat schedule' => [fn (DelayQueue $q) => $q->repeat('r', "* * * * $bad", 1), $invalid, '$schedule is not valid UTF-8 (byte 8)'],
            'repeat payload key' => [fn (DelayQueue $q) => $q->repeat('r', 60, ['a' => [$bad => 1]]), $payload, '$payload["a"]["\xff"]: the array key is not valid UTF-8'],
            'repeat tz' => [fn (DelayQueue $q) => $q->repeat('r', '0 2 * * *', 1, ['tz' => $bad]), $invalid, "repeat option 'tz' is not valid UTF-8"],
            'repeat option name' => [fn (DelayQueue $q) => $q->repeat('r', 60, 1, [$bad => 1]), $invalid, 'unknown repeat option "\xff"'],
            'unrepeat' => [fn (DelayQueue $q) => $q->unrepeat($bad), $invalid, 'DelayQueue::unrepeat(): Argument #1 ($name) is not valid UTF-8'],
            'get' => [fn (DelayQueue $q) => $q->get($bad), $invalid, 'DelayQueue::get(): Argument #1 ($id) is not valid UTF-8 (byte 0): "\xff"'],
            'cancel' => [fn (DelayQueue $q) => $q->cancel($bad), $invalid, 'DelayQueue::cancel(): Argument #1 ($id) is not valid UTF-8'],
            'reschedule' => [fn (DelayQueue $q) => $q->reschedule($bad, 1.0), $invalid, 'DelayQueue::reschedule(): Argument #1 ($id) is not valid UTF-8'],
            'find' => [fn (DelayQueue $q) => $q->find("order-$bad"), $invalid, 'DelayQueue::find(): Argument #1 ($text) is not valid UTF-8 (byte 6)'],
            'requeueDead' => [fn (DelayQueue $q) => $q->requeueDead($bad), $invalid, 'DelayQueue::requeueDead(): Argument #1 ($id) is not valid UTF-8'],
            'deleteDead' => [fn (DelayQueue $q) => $q->deleteDead($bad), $invalid, 'DelayQueue::deleteDead(): Argument #1 ($id) is not valid UTF-8'],
            'requeueDeadWithError' => [fn (DelayQueue $q) => $q->requeueDeadWithError($bad), $invalid, 'Argument #1 ($text) is not valid UTF-8'],
            'deleteDeadWithError' => [fn (DelayQueue $q) => $q->deleteDeadWithError($bad), $invalid, 'Argument #1 ($text) is not valid UTF-8'],
            'aclRule' => [fn (DelayQueue $q) => $q->aclRule($bad), $invalid, 'DelayQueue::aclRule(): Argument #1 ($user) is not valid UTF-8'],
            'constructor url' => [fn () => new DelayQueue($bad), $invalid, 'DelayQueue::__construct(): Argument #1 ($url) is not valid UTF-8'],
            'constructor queue name' => [fn () => new DelayQueue($url, $bad), $invalid, 'DelayQueue::__construct(): Argument #2 ($queue) is not valid UTF-8'],
            'constructor prefix' => [fn () => new DelayQueue($url, 'q', ['prefix' => $bad]), $invalid, "DelayQueue option 'prefix' is not valid UTF-8"],
            'constructor layout' => [fn () => new DelayQueue($url, 'q', ['layout' => $bad]), $invalid, "DelayQueue option 'layout' is not valid UTF-8"],
            'constructor option name' => [fn () => new DelayQueue($url, 'q', [$bad => 1]), $invalid, 'unknown DelayQueue option "\xff": not valid UTF-8'],
            'worker option name' => [fn (DelayQueue $q) => new DelayQueueWorker($q, [$bad => 1]), $invalid, 'unknown DelayQueueWorker option "\xff"'],
            'worker no_retry' => [fn (DelayQueue $q) => new DelayQueueWorker($q, ['no_retry' => [$bad => $bad]]), $invalid, "DelayQueueWorker option 'no_retry': item 0 is not valid UTF-8"],
            'worker lower_queues key' => [fn (DelayQueue $q) => new DelayQueueWorker($q, ['lower_queues' => [$bad => 1]]), TypeError::class, 'item 0 is int'],
        ];
    }

    /** @dataProvider invalidUtf8Inputs */
    #[PHPUnit\Framework\Attributes\DataProvider('invalidUtf8Inputs')]
    public function testInvalidUtf8IsRefusedWithADelayQueueExceptionNamingTheCulprit(callable $call, string $class, string $text): void
    {
        try {
            $call($this->q);
            $this->fail("no $class thrown");
        } catch (Throwable $e) {
            $this->assertInstanceOf($class, $e, get_class($e) . ': ' . $e->getMessage());
            $this->assertStringContainsString($text, $e->getMessage());
            $this->assertStringNotContainsString('Rust panic', $e->getMessage());
        }
        $this->assertSame([], $this->redis->keys('*'), 'bad input must write nothing');
    }

    public function testNoRustPanicOrBacktraceReachesStderr(): void
    {
        // The calls that made ext-php-rs panic ("Invalid array key!"), in a child with
        // RUST_BACKTRACE=1: each must end in a DelayQueue exception, and stderr stay empty.
        $code = <<<'PHP'
            $q = new DelayQueue($argv[1], 'orders');
            $bad = "\xff";
            $calls = [
                fn () => $q->push([$bad => 1]),
                fn () => $q->push(['list' => [0 => 1, $bad => 2]]),
                fn () => $q->push(1, 0, [$bad => 1]),
                fn () => $q->pushAt([$bad => 1], 1.0),
                fn () => $q->pushMany([['payload' => [$bad => 1]]]),
                fn () => $q->pushMany([[$bad => 1]]),
                fn () => $q->repeat('r', 60, [$bad => 1]),
                fn () => $q->repeat($bad, 60, 1),
                fn () => $q->get($bad),
                fn () => new DelayQueue($argv[1], 'q', [$bad => 1]),
                fn () => new DelayQueueWorker($q, ['no_retry' => [$bad => $bad]]),
            ];
            foreach ($calls as $call) {
                try {
                    $call();
                    echo "no exception\n";
                } catch (Throwable $e) {
                    echo get_class($e), "\n";
                }
            }
            PHP;
        $cmd = array_merge(delayq_php_command(), ['-r', $code, $GLOBALS['DELAYQ_REDIS']->url()]);
        $env = getenv() + ['RUST_BACKTRACE' => '1'];
        $env['RUST_BACKTRACE'] = '1';
        $proc = proc_open($cmd, [0 => ['file', '/dev/null', 'r'], 1 => ['pipe', 'w'], 2 => ['pipe', 'w']], $pipes, null, $env);
        $out = stream_get_contents($pipes[1]);
        $err = stream_get_contents($pipes[2]);
        fclose($pipes[1]);
        fclose($pipes[2]);
        $this->assertSame(0, proc_close($proc), $out . $err);
        $this->assertSame('', $err, 'nothing on stderr: no panic message, no backtrace');
        $classes = explode("\n", trim($out));
        $this->assertCount(11, $classes, $out);
        foreach ($classes as $class) {
            $this->assertMatchesRegularExpression('/^DelayQueue(Payload|InvalidArgument)Exception$/', $class, $out);
        }
    }

    public function testPayloadLimit(): void
    {
        $q = new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'small', ['max_payload_bytes' => 16]);
        try {
            $q->push(str_repeat('x', 100));
            $this->fail('an oversized payload was accepted');
        } catch (DelayQueuePayloadException $e) {
            $this->assertStringContainsString('over the limit of 16 bytes', $e->getMessage());
        }
        $this->assertSame([], $this->redis->keys('*'), 'an oversized payload writes nothing');
    }

    public function testListingsShowTheSizeOfAPayloadTheyLeaveOut(): void
    {
        // A payload within the producer's limit but past the listings' bound, and one
        // written straight into Redis past every limit: both shown as their size.
        $big = $this->q->push(['n' => 'big', 'pad' => str_repeat('x', 200000)], 60);
        $small = $this->q->push(['n' => 'small'], 30);
        $stored = $this->redis->hGet('{dq:orders}:messages', $big);
        $listed = array_column($this->q->waiting(), null, 'id');
        $this->assertSame(['n' => 'small'], $listed[$small]['payload']);
        $this->assertNull($listed[$small]['payload_omitted_bytes']);
        $this->assertNull($listed[$big]['payload']);
        $this->assertSame(strlen($stored), $listed[$big]['payload_omitted_bytes']);
        $this->assertSame(array_keys($this->q->get($small)), array_keys($listed[$big]), 'one shape');
        $whole = $this->q->get($big);
        $this->assertSame(200000, strlen($whole['payload']['pad']), 'get() shows it whole');
        $this->assertNull($whole['payload_omitted_bytes']);
    }

    public function testConnectionAndAuthErrorsAreTheirOwnClasses(): void
    {
        $sock = stream_socket_server('tcp://127.0.0.1:0');
        $port = (int) substr(strrchr(stream_socket_get_name($sock, false), ':'), 1);
        fclose($sock);
        $q = new DelayQueue("redis://:secret@127.0.0.1:$port", 'q', ['retry_timeout' => 0.2]);
        try {
            $q->push(1);
            $this->fail('connected to a closed port');
        } catch (DelayQueueConnectionException $e) {
            $this->assertStringNotContainsString('secret', $e->getMessage());
        }
        $this->redis->rawCommand('ACL', 'SETUSER', 'reader', 'on', '>pw', '~*', '+ping');
        $port = $GLOBALS['DELAYQ_REDIS']->port;
        $guess = 'guess-0f-mine';
        foreach (["redis://reader:pw@127.0.0.1:$port" => 'no permissions', "redis://reader:$guess@127.0.0.1:$port" => 'wrong password for user "reader"'] as $url => $text) {
            try {
                (new DelayQueue($url, 'q'))->push(1);
                $this->fail("$url: no DelayQueueAuthException");
            } catch (DelayQueueAuthException $e) {
                $this->assertStringContainsString($text, $e->getMessage());
                $this->assertStringNotContainsString($guess, $e->getMessage(), 'the password is not echoed');
            }
        }
        // A worker fails at its start with the same error, instead of retrying.
        $worker = new DelayQueueWorker(new DelayQueue("redis://reader:$guess@127.0.0.1:$port", 'q'), ['stop_when_empty' => true]);
        try {
            $worker->run(fn ($payload, $msg) => null);
            $this->fail('a worker ran with a wrong password');
        } catch (DelayQueueAuthException $e) {
            $this->assertStringContainsString('wrong password for user "reader"', $e->getMessage());
        }
        $this->assertSame([], $this->redis->keys('*'), 'refused calls write nothing');
    }

    public function testAQueueMadeBeforeForkWorksInParentAndChild(): void
    {
        $before = $this->q->push('before fork');
        $pid = pcntl_fork();
        if ($pid === 0) {
            // The child uses its copy (its own connection), then drops it.
            $ok = $this->q->get($before) !== null && $this->q->push('from child') !== '';
            unset($this->q);
            posix_kill(getmypid(), SIGKILL); // no shutdown handlers of the parent's test runner
            exit($ok ? 0 : 1);
        }
        pcntl_waitpid($pid, $status);
        $this->assertSame(2, $this->q->stats()['ready'], 'the child pushed through its own connection');
        // The parent's connection was not disturbed by the child's use or death.
        $this->assertNotSame('', $this->q->push('after fork'));
        $this->assertSame(3, $this->q->stats()['ready']);
    }

    public function testAPartitionedQueueSpreadsOverHashTagsAndKeepsKeyedMessagesTogether(): void
    {
        $url = $GLOBALS['DELAYQ_REDIS']->url();
        $q = new DelayQueue($url, 'parts', ['partitions' => 3]);
        $ids = $q->pushMany(array_map(fn ($i) => ['payload' => ['n' => $i], 'delay' => 60], range(0, 299)));
        // The queue's keys; the registry of queues (dq:queues) is none of them.
        $keys = array_filter($this->redis->keys('*'), fn ($k) => $k !== 'dq:queues');
        $tags = array_unique(array_map(fn ($k) => strstr($k, '}', true) . '}', $keys));
        $this->assertCount(3, $tags, 'three hash tags: ' . implode(' ', $tags));
        $stats = $q->stats();
        $this->assertSame([300, 3], [$stats['scheduled'], $stats['partitions']]);
        foreach (array_slice($ids, 0, 10) as $id) {
            $this->assertSame('scheduled', $q->get($id)['state']);
        }
        // Messages of one customer share a partition; by-id calls still find them.
        $keyed = [];
        foreach (range(0, 5) as $step) {
            $keyed[] = $q->push(['customer' => 'alice', 'step' => $step], 0, ['partition_key' => 'alice']);
        }
        $keyed[] = $q->pushAt('bob', 4102444800.0, ['partition_key' => 'bob']);
        $this->assertTrue($q->cancel($keyed[6]));
        $this->assertTrue($q->reschedule($keyed[0], 30));
        $this->assertSame(306, $q->purge());

        try {
            $q->push(1, 0, ['partition_key' => '']);
            $this->fail('empty partition_key accepted');
        } catch (DelayQueueInvalidArgumentException $e) {
            $this->assertStringContainsString('partition_key', $e->getMessage());
        }
        foreach ([0, 1025, 'x'] as $bad) {
            try {
                new DelayQueue($url, 'parts', ['partitions' => $bad]);
                $this->fail("partitions => $bad accepted");
            } catch (DelayQueueInvalidArgumentException | TypeError $e) {
                $this->assertStringContainsString('partitions', $e->getMessage());
            }
        }
    }

    public function testAPushThatNoReplicaConfirmsRaisesATimeout(): void
    {
        $q = new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'durable', ['wait_replicas' => 1, 'wait_timeout' => 0.1]);
        try {
            $q->push('must survive a failover', 0, ['id' => 'order-1']);
            $this->fail('no replica, yet the push returned');
        } catch (DelayQueueTimeoutException $e) {
            $this->assertStringContainsString('0 of 1 replicas', $e->getMessage());
        }
        $this->assertSame('ready', $q->get('order-1')['state'], 'it is on the master');
    }

    public function testFindShowsTheMessagesHoldingATextInAnyState(): void
    {
        foreach (range(0, 1499) as $i) {
            $items[] = ['payload' => ['order_id' => 20000 + $i], 'delay' => 3600];
        }
        $this->q->pushMany($items);
        $id = $this->q->push(['order_id' => 10086, 'step' => 'remind'], 600);
        $found = $this->q->find('10086');
        $this->assertSame([[$id, 'scheduled', ['order_id' => 10086, 'step' => 'remind']]],
            array_map(fn ($m) => [$m['id'], $m['state'], $m['payload']], $found));
        $this->assertCount(3, $this->q->find('"order_id":2000', 3), 'the limit holds');
        $this->assertSame([], $this->q->find('no such order'));
        $this->expectException(DelayQueueInvalidArgumentException::class);
        $this->q->find('');
    }

    public function testFindFieldMatchesAPayloadFieldExactly(): void
    {
        $order = $this->q->push(['order_id' => 10086], 600);
        $asText = $this->q->push(['order_id' => '10086'], 600);
        foreach ([['order_id' => 100861], ['sub_order_id' => 10086], ['nested' => ['order_id' => 10086]]] as $other) {
            $this->q->push($other, 600);
        }
        $this->assertCount(5, $this->q->find('10086'));
        $this->assertSame([$order], array_column($this->q->findField('order_id', 10086), 'id'));
        $this->assertSame([$asText], array_column($this->q->findField('order_id', '10086'), 'id'));
        $this->assertSame([], $this->q->findField('order_id', 1));
        $this->expectException(DelayQueueInvalidArgumentException::class);
        $this->q->findField('order_id', [10086]);
    }

    public function testAclRuleGrantsAUserExactlyThisQueue(): void
    {
        $rule = $this->q->aclRule('app');
        $this->assertStringStartsWith('ACL SETUSER app on >PASSWORD resetkeys ~{dq:orders}:*', $rule);
        $words = preg_split('/\s+/', str_replace('>PASSWORD', '>s3cret', $rule));
        $this->assertSame('ACL', array_shift($words));
        try {
            $this->assertSame(true, $this->redis->rawCommand('ACL', ...$words));
            $port = $GLOBALS['DELAYQ_REDIS']->port;
            $q = new DelayQueue("redis://app:s3cret@127.0.0.1:$port", 'orders');
            $id = $q->push(['order_id' => 1], 60);
            $this->assertSame('scheduled', $q->get($id)['state']);
            $this->assertSame(1, $q->stats()['scheduled']);
        } finally {
            $this->redis->rawCommand('ACL', 'DELUSER', 'app');
        }
        try {
            $this->q->aclRule('');
            $this->fail('an empty user was accepted');
        } catch (DelayQueueInvalidArgumentException $e) {
            $this->assertStringContainsString('user', $e->getMessage());
        }
    }

    public function testARuleWithoutScriptLoadWorksOnceAnAdminLoadedTheScripts(): void
    {
        $rule = $this->q->aclRule('strict', preloadedScripts: true);
        $this->assertStringNotContainsString('script|load', $rule);
        $words = preg_split('/\s+/', str_replace('>PASSWORD', '>s3cret', $rule));
        array_shift($words);
        try {
            $this->assertSame(true, $this->redis->rawCommand('ACL', ...$words));
            $this->redis->rawCommand('SCRIPT', 'FLUSH');
            $port = $GLOBALS['DELAYQ_REDIS']->port;
            $q = new DelayQueue("redis://strict:s3cret@127.0.0.1:$port", 'orders');
            try {
                $q->push(['order_id' => 1]);
                $this->fail('pushed without the scripts');
            } catch (DelayQueueAuthException $e) {
                $this->assertStringContainsString('delayq load-scripts', $e->getMessage());
            }
            $this->assertGreaterThan(5, $this->q->loadScripts());
            $this->assertContains($q->get($q->push(['order_id' => 2]))['state'], ['ready', 'scheduled']);
        } finally {
            $this->redis->rawCommand('ACL', 'DELUSER', 'strict');
        }
    }

    public function testARuleForFunctionsWorksOnceAnAdminInstalledThem(): void
    {
        if (version_compare($this->redis->info('server')['redis_version'], '7.0', '<')) {
            $this->markTestSkipped('Functions came with Redis 7.0: the EVALSHA rules are for Redis 6');
        }
        $rule = $this->q->aclRule('fn', functions: true);
        $this->assertStringContainsString('+fcall', $rule);
        $this->assertStringNotContainsString('+evalsha', $rule);
        $this->assertStringNotContainsString('script|load', $rule);
        try {
            $this->q->aclRule('fn', preloadedScripts: true, functions: true);
            $this->fail('both ways were accepted');
        } catch (DelayQueueInvalidArgumentException $e) {
            $this->assertStringContainsString('give one', $e->getMessage());
        }
        $words = preg_split('/\s+/', str_replace('>PASSWORD', '>s3cret', $rule));
        array_shift($words);
        try {
            $this->assertSame(true, $this->redis->rawCommand('ACL', ...$words));
            $this->redis->rawCommand('FUNCTION', 'FLUSH');
            $port = $GLOBALS['DELAYQ_REDIS']->port;
            $q = new DelayQueue("redis://fn:s3cret@127.0.0.1:$port", 'orders');
            try {
                $q->push(['order_id' => 1]);
                $this->fail('pushed without the functions');
            } catch (DelayQueueAuthException $e) {
                $this->assertStringContainsString('delayq install-functions', $e->getMessage());
            }
            $this->assertStringStartsWith('delayq_', $this->q->installFunctions());
            $this->assertContains($q->get($q->push(['order_id' => 2]))['state'], ['ready', 'scheduled']);
        } finally {
            $this->redis->rawCommand('ACL', 'DELUSER', 'fn');
            $this->redis->rawCommand('FUNCTION', 'FLUSH');
        }
    }

    public function testTheUrlIsASensitiveParameterInTracesWithArguments(): void
    {
        if (PHP_VERSION_ID < 80200) {
            $this->markTestSkipped('#[\\SensitiveParameter] came with PHP 8.2');
        }
        $before = ini_set('zend.exception_ignore_args', '0');
        try {
            new DelayQueue('redis://:s3cret@127.0.0.1:1', '');
            $this->fail('an empty queue name was accepted');
        } catch (DelayQueueInvalidArgumentException $e) {
            $this->assertInstanceOf(SensitiveParameterValue::class, $e->getTrace()[0]['args'][0]);
            $this->assertStringNotContainsString('s3cret', print_r($e->getTrace(), true));
        } finally {
            ini_set('zend.exception_ignore_args', (string) $before);
        }
    }
}
