<?php
// A pool run as a process by test_stall.py and test_rolling_deploy.py:
//   php span_pool.php URL QUEUE LOG OPTIONS_JSON
// For each message, appends "<n> <attempt> <pid> start <unix time>" to LOG when the
// handler starts and "... end ..." when it returns; a payload's "sleep" (seconds) is
// slept on its first attempt, and a payload with "fail" fails its first attempt.
// OPTIONS_JSON holds DelayQueueWorker options.
declare(strict_types=1);

[, $url, $queue, $log, $options] = $argv;
$note = function (array $payload, DelayQueueMessage $m, string $what) use ($log): void {
    $line = sprintf("%d %d %d %s %.6f\n", $payload['n'], $m->attempt, getmypid(), $what, microtime(true));
    file_put_contents($log, $line, FILE_APPEND | LOCK_EX);
};
$worker = new DelayQueueWorker(new DelayQueue($url, $queue), json_decode($options, true, 512, JSON_THROW_ON_ERROR));
$worker->run(function (array $payload, DelayQueueMessage $m) use ($note) {
    $note($payload, $m, 'start');
    if ($m->attempt === 1) {
        usleep((int) (($payload['sleep'] ?? 0) * 1e6));
    }
    $note($payload, $m, 'end');
    if ($m->attempt === 1 && ($payload['fail'] ?? false)) {
        throw new RuntimeException("message {$payload['n']} fails its first attempt");
    }
});
