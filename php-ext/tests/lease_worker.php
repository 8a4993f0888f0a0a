<?php
// A worker run as a child process by LeaseTest, without a supervisor:
//   php lease_worker.php URL QUEUE LOG OPTIONS_JSON
// Appends "<n> <attempt> <pid> <start>" (microtime) to LOG as each handler starts. A
// payload with "kill" makes the handler kill its own process (SIGKILL), every time.
// OPTIONS_JSON holds worker options, and "_sleep_ms" how long each handler runs.
declare(strict_types=1);

[, $url, $queue, $log, $options] = $argv;
$options = json_decode($options, true, 512, JSON_THROW_ON_ERROR);
$sleepMs = $options['_sleep_ms'] ?? 1;
unset($options['_sleep_ms']);
$worker = new DelayQueueWorker(new DelayQueue($url, $queue), $options);
$worker->run(function ($payload, DelayQueueMessage $m) use ($log, $sleepMs) {
    file_put_contents($log, sprintf("%d %d %d %.6f\n", $payload['n'], $m->attempt, getmypid(), microtime(true)),
        FILE_APPEND);
    if ($payload['kill'] ?? false) {
        posix_kill(getmypid(), SIGKILL);
    }
    usleep($sleepMs * 1000);
});
