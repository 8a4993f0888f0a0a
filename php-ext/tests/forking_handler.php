<?php
// A worker run as a child process by WorkerTest, whose handler forks for side work:
//   php forking_handler.php URL QUEUE LOG [OPTIONS_JSON]
// A payload with "child" => "return", "exit" or "throw" forks: the child pushes
// ['from_child' => n] to the queue "side", registers a shutdown function that would
// touch LOG.shutdown-ran, then returns from the handler, calls exit(7) or throws. The
// parent waits for the child (at most 5 s, then kills it), appends "<n> <child pid>
// <how the child ended>" to LOG ("exit <code>", "signal <number>", or "alive": it had
// not ended) and, with "hang", then sleeps for an hour on its first attempt. Other
// payloads append "<n> - plain". The worker stops once the queue is empty (unless
// OPTIONS_JSON says otherwise) and writes run()'s summary to LOG.summary.
declare(strict_types=1);

[, $url, $queue, $log] = $argv;
$options = json_decode($argv[4] ?? '{}', true, 512, JSON_THROW_ON_ERROR);
$worker = new DelayQueueWorker(new DelayQueue($url, $queue), $options + ['stop_when_empty' => true]);
$summary = $worker->run(function (array $payload, DelayQueueMessage $m) use ($url, $log) {
    if (!isset($payload['child'])) {
        file_put_contents($log, "{$payload['n']} - plain\n", FILE_APPEND);
        return;
    }
    $pid = pcntl_fork();
    if ($pid === -1) {
        throw new RuntimeException('pcntl_fork failed');
    }
    if ($pid === 0) {
        (new DelayQueue($url, 'side'))->push(['from_child' => $payload['n']]);
        register_shutdown_function(fn () => touch("$log.shutdown-ran"));
        if ($payload['child'] === 'exit') {
            exit(7);
        }
        if ($payload['child'] === 'throw') {
            throw new DomainException("the side work of {$payload['n']} failed");
        }
        return;
    }
    $deadline = microtime(true) + 5;
    while (($done = pcntl_waitpid($pid, $status, WNOHANG)) === 0 && microtime(true) < $deadline) {
        usleep(10000);
    }
    if ($done !== $pid) {
        posix_kill($pid, SIGKILL);
        pcntl_waitpid($pid, $status);
        $how = 'alive';
    } elseif (pcntl_wifexited($status)) {
        $how = 'exit ' . pcntl_wexitstatus($status);
    } else {
        $how = 'signal ' . pcntl_wtermsig($status);
    }
    file_put_contents($log, "{$payload['n']} $pid $how\n", FILE_APPEND);
    if (($payload['hang'] ?? false) && $m->attempt === 1) {
        sleep(3600);
    }
});
file_put_contents("$log.summary", json_encode($summary));
