<?php
// W1 / W1b: push N messages, one call each or in batches.
//   php push.php --system=seed|zadd|script|delayq --mode=single|bulk --n=20000 --url=redis://...
declare(strict_types=1);
require __DIR__ . '/common.php';

$a = bench_args($argv);
$n = (int) ($a['n'] ?? 20000);
$system = $a['system'];
$mode = $a['mode'] ?? 'single';
$url = $a['url'];

if ($system === 'seed') {
    // The recipe's producer (../shared/seeds, article 000): uniqid ids, HSET + ZADD,
    // whole-second scores; bulk is the same commands hand-pipelined, 50 pairs a
    // pipeline (issue 29's measure of a batched push).
    $redis = bench_redis($url);
    $t0 = microtime(true);
    if ($mode === 'single') {
        for ($i = 0; $i < $n; $i++) {
            $msgId = uniqid('msg_', true);
            $redis->hSet('delay_queue:payload', $msgId, json_encode(['order_id' => $i, 'action' => 'close'], JSON_UNESCAPED_UNICODE));
            $redis->zAdd('delay_queue:zset', time() + 60, $msgId);
        }
    } else {
        for ($i = 0; $i < $n; $i += 50) {
            $pipe = $redis->multi(Redis::PIPELINE);
            for ($j = $i; $j < min($n, $i + 50); $j++) {
                $msgId = uniqid('msg_', true);
                $pipe->hSet('delay_queue:payload', $msgId, json_encode(['order_id' => $j, 'action' => 'close']));
                $pipe->zAdd('delay_queue:zset', time() + 60, $msgId);
            }
            $pipe->exec();
        }
    }
    $secs = microtime(true) - $t0;
    $stored = $redis->zCard('delay_queue:zset');
} elseif ($system === 'zadd' || $system === 'script') {
    // Yardsticks, not queues (issue 29, item 4): one phpredis ZADD a call, the least
    // any PHP producer pays for one round trip; or one script a call that does only
    // that ZADD, with as many keys as push.lua takes: the least a push pays that is
    // one script.
    if ($mode !== 'single') {
        fwrite(STDERR, "push.php: --system=$system has --mode=single only\n");
        exit(2);
    }
    $redis = bench_redis($url);
    $keys = array_map(fn (int $k) => "{bench}:k$k", range(1, 6));
    $keys[0] = 'delay_queue:zset';
    $sha = $redis->script('load', "redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2]) return 1");
    $t0 = microtime(true);
    for ($i = 0; $i < $n; $i++) {
        if ($system === 'zadd') {
            $redis->zAdd('delay_queue:zset', time() + 60, "msg_$i");
        } else {
            $redis->evalSha($sha, [...$keys, time() + 60, "msg_$i"], 6);
        }
    }
    $secs = microtime(true) - $t0;
    $stored = $redis->zCard('delay_queue:zset');
} else {
    $q = new DelayQueue($url, 'bench');
    $t0 = microtime(true);
    if ($mode === 'single') {
        for ($i = 0; $i < $n; $i++) {
            $q->push(['order_id' => $i, 'action' => 'close'], 60);
        }
    } else {
        for ($i = 0; $i < $n; $i += 1000) {
            $items = [];
            for ($j = $i; $j < min($n, $i + 1000); $j++) {
                $items[] = ['payload' => ['order_id' => $j, 'action' => 'close'], 'delay' => 60];
            }
            $q->pushMany($items);
        }
    }
    $secs = microtime(true) - $t0;
    $stored = $q->stats()['scheduled'];
}
bench_result(['rate' => $n / $secs, 'seconds' => $secs, 'stored' => $stored, 'expected' => $n]);
