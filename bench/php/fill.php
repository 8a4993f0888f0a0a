<?php
// Fills a queue before a consumer run (not timed): N messages due now (W2), or due
// spread over 0-10 s (W3). Writes "order_id requested_due" lines to --due-file.
// With --stamp (seed only), each text starts "0|<due ms>|": the stamp of
// bench/floor's lease per claim, written as a push would write it.
// With --orders=K (delayq only), each payload also holds a list of K orders, as
// bench/get_payload.py's: a payload whose decoding costs the consumer something.
//   php fill.php --system=seed|delayq --n=N --url=... [--spread=10] [--stamp] [--orders=K] --due-file=F
declare(strict_types=1);
require __DIR__ . '/common.php';

$a = bench_args($argv);
$n = (int) $a['n'];
$spread = (float) ($a['spread'] ?? 0);
$system = $a['system'];
$stamp = isset($a['stamp']);
$lines = [];
if ($system === 'seed') {
    $redis = bench_redis($a['url']);
    $pipe = $redis->multi(Redis::PIPELINE);
    for ($i = 0; $i < $n; $i++) {
        $delay = $spread > 0 ? $spread * $i / $n : 0;
        $requested = microtime(true) + $delay;
        // The recipe's score: time() + delay, whole seconds.
        $id = uniqid('msg_', true);
        $due = time() + (int) $delay;
        $text = json_encode(['order_id' => $i, 'action' => 'close']);
        $pipe->hSet('delay_queue:payload', $id, $stamp ? '0|' . ($due * 1000) . '|' . $text : $text);
        $pipe->zAdd('delay_queue:zset', $due, $id);
        $lines[] = "$i $requested";
        if ($i % 1000 === 999) {
            $pipe->exec();
            $pipe = $redis->multi(Redis::PIPELINE);
        }
    }
    $pipe->exec();
} else {
    $q = new DelayQueue($a['url'], 'bench');
    $orders = [];
    for ($i = 0; $i < (int) ($a['orders'] ?? 0); $i++) {
        $orders[] = ['order_id' => 10086 + $i, 'action' => 'close', 'amount' => 12.5, 'tags' => ['a', 'b']];
    }
    $items = [];
    for ($i = 0; $i < $n; $i++) {
        $delay = $spread > 0 ? $spread * $i / $n : 0;
        // An absolute due time: what the runner records is exactly what delayq schedules.
        $requested = microtime(true) + $delay;
        $payload = ['order_id' => $i, 'action' => 'close'];
        if ($orders) {
            $payload['orders'] = $orders;
        }
        $items[] = ['payload' => $payload, 'at' => $requested];
        $lines[] = "$i $requested";
        if (count($items) === 1000) {
            $q->pushMany($items);
            $items = [];
        }
    }
    if ($items) {
        $q->pushMany($items);
    }
}
file_put_contents($a['due-file'], implode("\n", $lines));
// Consumers started before the fill stop only once it is complete and drained.
bench_redis($a['url'])->set('bench:filled', '1');
