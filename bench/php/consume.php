<?php
// W2-W6 consumers: 4 worker processes, no-op handler (or --sleep-ms of work). Each process writes
// "order_id handled_at" lines (handled_at: Unix seconds, float) to RECORDS/<pid> when
// it ends; the runner checks them for loss and duplicates and computes the figures.
//   php consume.php --system=seed|delayq --url=... --records=DIR [--until-empty]
//       [--sleep-ms=0] [--lease=30] [--stream-records]
// Without --until-empty it runs until SIGTERM (idle-cost runs).
declare(strict_types=1);
require __DIR__ . '/common.php';

$a = bench_args($argv);
$system = $a['system'];
$url = $a['url'];
$records = $a['records'];
$untilEmpty = isset($a['until-empty']);
$procs = 4;
$seen = [];
$sleepMs = (float) ($a['sleep-ms'] ?? 0);
// Records appended one by one, not kept in memory: kill -9 and memory runs.
$stream = $sleepMs > 0 || isset($a['stream-records']);
$lease = (float) ($a['lease'] ?? 30);

$flush = function () use (&$seen, $records, $stream) {
    if ($stream) {
        return; // written as they happened
    }
    file_put_contents("$records/" . getmypid(), implode("\n", $seen));
};
// The no-op handler keeps its records in memory; a handler with work (--sleep-ms, the
// kill -9 run) appends each record at once, so a killed process keeps what it did.
$handled = function (int $orderId) use (&$seen, $records, $sleepMs, $stream) {
    if ($sleepMs > 0) {
        usleep((int) ($sleepMs * 1000));
    }
    if ($stream) {
        file_put_contents("$records/" . getmypid(), $orderId . ' ' . microtime(true) . "\n", FILE_APPEND);
    } else {
        $seen[] = $orderId . ' ' . microtime(true);
    }
};

if ($system === 'seed') {
    // The recipe's consumer (article 000): pop_delay.lua with time(), batch 50,
    // usleep(200 ms) when nothing is due, in pcntl_fork processes.
    $pop = file_get_contents(dirname(__DIR__, 2) . '/tests/fixtures/pop_delay.lua');
    $stop = false;
    pcntl_async_signals(true);
    $pids = [];
    for ($p = 0; $p < $procs; $p++) {
        $pid = pcntl_fork();
        if ($pid === 0) {
            pcntl_signal(SIGTERM, function () use (&$stop) { $stop = true; }, false);
            $redis = bench_redis($url);
            while (!$stop) {
                $result = $redis->eval($pop, ['delay_queue:zset', 'delay_queue:payload', time(), 50], 2);
                if (!$result) {
                    // Only the bench's end check; the recipe itself loops forever.
                    if ($untilEmpty && $redis->exists('bench:filled') && $redis->zCard('delay_queue:zset') === 0) {
                        break;
                    }
                    usleep(200 * 1000);
                    continue;
                }
                for ($i = 0; $i < count($result); $i += 2) {
                    $handled(json_decode($result[$i + 1], true)['order_id']);
                }
            }
            $flush();
            exit(0);
        }
        $pids[] = $pid;
    }
    bench_wait_children($pids);
    exit(0);
}

$q = new DelayQueue($url, 'bench');
$w = new DelayQueueWorker($q, ['processes' => $procs, 'threads' => 2, 'batch' => 1000, 'lease' => $lease,
    'on_stop' => $flush]);
if ($untilEmpty) {
    $marker = bench_redis($url);
    pcntl_signal(SIGALRM, function () use ($q, $w, $marker) {
        $s = $q->stats();
        if ($marker->exists('bench:filled') && $s['ready'] + $s['scheduled'] + $s['inflight'] === 0) {
            $w->stop();
        } else {
            pcntl_alarm(1);
        }
    });
    pcntl_alarm(1);
}
$w->run(function (array $payload) use ($handled) {
    $handled($payload['order_id']);
});
