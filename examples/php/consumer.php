<?php
// The recipe's Swoole consumer.php, done with delayq: a supervised pool of worker
// processes. A message is deleted only after the handler returns; a worker that dies
// or hangs loses its lease and the message is delivered again; failures retry with
// backoff and end in the dead-letter set. SIGTERM / Ctrl-C stop it gracefully.
//   php consumer.php [--until-empty]   (REDIS_URL defaults to redis://127.0.0.1:6379)
declare(strict_types=1);

$queue = new DelayQueue(getenv('REDIS_URL') ?: 'redis://127.0.0.1:6379', 'orders');
$untilEmpty = in_array('--until-empty', $argv, true);

$worker = new DelayQueueWorker($queue, [
    'processes' => 2,       // forked handler processes, restarted if they die
    'threads' => 2,         // Redis I/O threads per process
    'max_attempts' => 5,    // then the dead-letter set
    'backoff_base' => 0.1,
    'timeout' => 30.0,      // a handler stuck longer is killed; its message goes to another process
    'max_jobs' => 100000,   // recycle a process now and then, as long-running PHP should
    'on_start' => function () {
        // Open per-process resources here (database connections): runs after the fork.
    },
    'on_failure' => function (array $order, DelayQueueMessage $msg, Throwable $e) {
        // Report to an error tracker here (\Sentry\captureException($e)).
        fprintf(STDERR, "order %d failed on attempt %d of %d: %s\n",
            $order['order_id'], $msg->attempt, $msg->maxAttempts, $e->getMessage());
    },
]);

if ($untilEmpty) {
    // The supervisor runs pcntl signal handlers between its rounds: once a second,
    // stop the whole pool when nothing is left.
    pcntl_signal(SIGALRM, function () use ($queue, $worker) {
        $s = $queue->stats();
        if ($s['scheduled'] + $s['ready'] + $s['inflight'] === 0) {
            $worker->stop();
        } else {
            pcntl_alarm(1);
        }
    });
    pcntl_alarm(1);
}

$late = [];
$summary = $worker->run(function (array $order, DelayQueueMessage $msg) use (&$late) {
    // closeOrder($order['order_id']) would go here; it should be idempotent, since a
    // message can run again after a crash.
    if ($order['order_id'] % 500 === 0 && $msg->attempt === 1) {
        throw new RuntimeException("payment service timed out for order {$order['order_id']}");
    }
    $late[] = (microtime(true) - $msg->dueAt) * 1000;
    if (count($late) === 500) {
        sort($late);
        printf("process %d: 500 orders closed, lateness p50 %.1f ms, p99 %.1f ms, earliest %+.1f ms\n",
            getmypid(), $late[250], $late[494], $late[0]);
    }
});
printf("pool stopped (%s): %d handled, %d acked, %d retried, %d dead, %d restarts\n",
    $summary['stopped_by'], $summary['handled'], $summary['acked'], $summary['retried'], $summary['dead'],
    $summary['restarts']);
$stats = $queue->stats();
printf("queue: %d scheduled, %d ready, %d inflight, %d dead; %d acked in all\n",
    $stats['scheduled'], $stats['ready'], $stats['inflight'], $stats['dead'], $stats['acked']);
