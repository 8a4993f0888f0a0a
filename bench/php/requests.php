<?php
// What one push costs a PHP-FPM request: every request makes its producer anew and
// drops it at its end, so without a persistent connection it connects each time.
//   php requests.php --variant=recipe|recipe-pconnect|delayq|delayq-persistent --n=2000 --url=redis://...
declare(strict_types=1);
require __DIR__ . '/common.php';

$a = bench_args($argv);
$n = (int) ($a['n'] ?? 2000);
$url = $a['url'];
$variant = $a['variant'];
$p = parse_url($url);
[$host, $port] = [$p['host'] ?? '127.0.0.1', (int) ($p['port'] ?? 6379)];

$request = match ($variant) {
    // The recipe's producer (../shared/seeds, article 000), connecting per request or
    // with phpredis's persistent connection.
    'recipe', 'recipe-pconnect' => function (int $i) use ($host, $port, $variant): void {
        $redis = new Redis();
        $variant === 'recipe' ? $redis->connect($host, $port, 2.0) : $redis->pconnect($host, $port, 2.0);
        $msgId = uniqid('msg_', true);
        $redis->hSet('delay_queue:payload', $msgId, json_encode(['order_id' => $i, 'action' => 'close']));
        $redis->zAdd('delay_queue:zset', time() + 1800, $msgId);
        if ($variant === 'recipe') {
            $redis->close();
        }
    },
    'delayq', 'delayq-persistent' => function (int $i) use ($url, $variant): void {
        $q = new DelayQueue($url, 'orders', ['persistent' => $variant === 'delayq-persistent']);
        $q->push(['order_id' => $i, 'action' => 'close'], 1800);
    },
};
$request(-1); // the first request of a worker process is not what the others cost
$t0 = microtime(true);
for ($i = 0; $i < $n; $i++) {
    $request($i);
}
$secs = microtime(true) - $t0;
bench_result(['variant' => $variant, 'n' => $n, 'us_per_request' => round($secs / $n * 1e6, 1)]);
