<?php
// Issue 29's bulk push: N messages, the recipe's hand pipeline against pushMany.
//   php bulk_push.php --system=seed|delayq --n=100000 --batch=1000 --pipeline=50 --url=redis://...
// seed: HSET + ZADD pairs, `--pipeline` pairs per phpredis pipeline, uniqid ids, as
// ../shared/seeds' producer; delayq: pushMany of `--batch` messages, ids generated.
declare(strict_types=1);
require __DIR__ . '/common.php';

$a = bench_args($argv);
$n = (int) ($a['n'] ?? 100000);
$url = $a['url'];
$payload = fn (int $i) => ['order_id' => $i, 'action' => 'close'];

if ($a['system'] === 'seed') {
    $per = (int) ($a['pipeline'] ?? 50);
    $redis = bench_redis($url);
    $t0 = microtime(true);
    for ($i = 0; $i < $n; $i += $per) {
        $pipe = $redis->multi(Redis::PIPELINE);
        for ($j = $i; $j < min($n, $i + $per); $j++) {
            $msgId = uniqid('msg_', true);
            $pipe->hSet('delay_queue:payload', $msgId, json_encode($payload($j)));
            $pipe->zAdd('delay_queue:zset', time() + 60, $msgId);
        }
        $pipe->exec();
    }
    $secs = microtime(true) - $t0;
    $stored = $redis->zCard('delay_queue:zset');
} else {
    $per = (int) ($a['batch'] ?? 1000);
    $q = new DelayQueue($url, 'bench');
    $t0 = microtime(true);
    for ($i = 0; $i < $n; $i += $per) {
        $items = [];
        for ($j = $i; $j < min($n, $i + $per); $j++) {
            $items[] = ['payload' => $payload($j), 'delay' => 60];
        }
        $q->pushMany($items);
    }
    $secs = microtime(true) - $t0;
    $stored = $q->stats()['scheduled'];
}
bench_result(['rate' => $n / $secs, 'seconds' => $secs, 'stored' => $stored, 'expected' => $n]);
