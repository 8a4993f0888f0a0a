<?php
// A script run by WorkerTest that forks a child of its own (not a handler's) before it
// runs a supervised pool, then waits for that child itself:
//   php own_child.php URL QUEUE
// Prints JSON: what pcntl_waitpid() returned for the child, the child's exit status
// and run()'s stopped_by. The pool must not reap a child it did not start.
declare(strict_types=1);

[, $url, $queue] = $argv;
$child = pcntl_fork();
if ($child === -1) {
    throw new RuntimeException('pcntl_fork failed');
}
if ($child === 0) {
    usleep(200000);
    exit(5);
}
$worker = new DelayQueueWorker(new DelayQueue($url, $queue),
    ['processes' => 2, 'timeout' => 30, 'stop_when_empty' => true]);
// Each handler outlasts the child, so the supervisor looks for ended processes after it ended.
$summary = $worker->run(function (array $payload): void {
    usleep(800000);
});
$waited = pcntl_waitpid($child, $status);
echo json_encode([
    'waited' => $waited === $child,
    'status' => $waited === $child ? pcntl_wexitstatus($status) : null,
    'stopped_by' => $summary['stopped_by'],
    'handled' => $summary['handled'],
]), "\n";
