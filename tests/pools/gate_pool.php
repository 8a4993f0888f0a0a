<?php
// A pool run as a process by test_rolling_deploy.py's cancel tests, under either build:
//   php gate_pool.php URL QUEUE LABEL LOG GATES OPTIONS_JSON
// A handler appends "<id> <attempt> <pid> start <unix time> -" to LOG, then waits for
// the file GATES/<id> to hold a JSON object with a field LABEL, the outcome the test
// wants of this pool's run: "ok" returns, "fail" throws, "dead" dead-letters. Under a
// build that knows cancel marks ($m->isCancelled()), a mark ends the wait too, as a
// handler that looks for it would stop. It then appends
// "<id> <attempt> <pid> end <unix time> <outcome>:<cancelled>", cancelled being 1 or 0
// as isCancelled() tells, "-" where the build has no such method.
// OPTIONS_JSON holds DelayQueueWorker options.
declare(strict_types=1);

[, $url, $queue, $label, $log, $gates, $options] = $argv;
$note = function (DelayQueueMessage $m, string $what, string $detail) use ($log): void {
    $line = sprintf("%s %d %d %s %.6f %s\n", $m->id, $m->attempt, getmypid(), $what, microtime(true), $detail);
    file_put_contents($log, $line, FILE_APPEND | LOCK_EX);
};
$knows_marks = method_exists(DelayQueueMessage::class, 'isCancelled');
$worker = new DelayQueueWorker(new DelayQueue($url, $queue), json_decode($options, true, 512, JSON_THROW_ON_ERROR));
$worker->run(function (array $payload, DelayQueueMessage $m) use ($note, $knows_marks, $label, $gates) {
    $note($m, 'start', '-');
    $outcome = 'timeout';
    // Bounded: a test that forgot a gate fails on the log, not on a hung pool.
    $deadline = microtime(true) + 30;
    while (microtime(true) < $deadline) {
        $gate = @file_get_contents("$gates/{$m->id}");
        $wanted = $gate === false ? null : (json_decode($gate, true)[$label] ?? null);
        if ($wanted !== null) {
            $outcome = $wanted;
            break;
        }
        if ($knows_marks && $m->isCancelled()) {
            $outcome = 'ok';
            break;
        }
        usleep(10000);
    }
    $note($m, 'end', $outcome . ':' . ($knows_marks ? (int) $m->isCancelled() : '-'));
    if ($outcome === 'fail') {
        throw new RuntimeException("{$m->id} fails in $label");
    }
    if ($outcome === 'dead') {
        $m->deadLetter("{$m->id} dead-lettered in $label");
    }
});
