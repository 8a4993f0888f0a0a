<?php
// A worker run as a child process by WorkerTest:
//   php worker_script.php URL QUEUE LOG OPTIONS_JSON
// Appends "<n> <attempt> <pid> <partition> <queue>\n" to LOG for every handled message. A
// payload with "hang" sleeps forever on its first attempt; one with "exit" calls exit(3);
// one with "kill" kills its own process (SIGKILL) on every attempt;
// one with "hold" never returns (and touches LOG.holding); one with "span" appends
// "<n> <start> <end>" (microtime) to LOG.spans.
// OPTIONS_JSON holds worker options, "_queue" the queue's own options and "_lower" the
// names of lower-priority queues on the same Redis.
declare(strict_types=1);

[, $url, $queue, $log, $options] = $argv;
$options = json_decode($options, true, 512, JSON_THROW_ON_ERROR);
$sleepMs = $options['_sleep_ms'] ?? 1;
$queueOptions = $options['_queue'] ?? [];
$options['lower_queues'] = array_map(fn ($name) => new DelayQueue($url, $name, $queueOptions), $options['_lower'] ?? []);
unset($options['_sleep_ms'], $options['_queue'], $options['_lower']);
$options['on_start'] = function () use ($log) {
    file_put_contents("$log.starts", getmypid() . "\n", FILE_APPEND);
};
$options['on_stop'] = function () use ($log) {
    file_put_contents("$log.stops", getmypid() . "\n", FILE_APPEND);
};
$worker = new DelayQueueWorker(new DelayQueue($url, $queue, $queueOptions), $options);
$summary = $worker->run(function ($payload, DelayQueueMessage $m) use ($log, $sleepMs) {
    if ($payload['hold'] ?? false) {
        // Runs until the process is ended: a signal cuts usleep() short, not the loop.
        touch("$log.holding");
        while (true) {
            usleep(50000);
        }
    }
    if (($payload['hang'] ?? false) && $m->attempt <= ($payload['hang_attempts'] ?? 1)) {
        sleep(3600);
    }
    if ($payload['exit'] ?? false) {
        exit(3);
    }
    if ($payload['kill'] ?? false) {
        posix_kill(getmypid(), SIGKILL);
    }
    $start = microtime(true);
    usleep($sleepMs * 1000);
    if ($payload['span'] ?? false) {
        file_put_contents("$log.spans", sprintf("%d %.6f %.6f\n", $payload['n'], $start, microtime(true)), FILE_APPEND);
    }
    file_put_contents($log, "{$payload['n']} {$m->attempt} " . getmypid() . " {$m->partition} {$m->queue}\n", FILE_APPEND);
});
file_put_contents("$log.summary", json_encode($summary));
