<?php
// Shared by the bench scripts: argument parsing and the per-message record files that
// prove each run handled every message exactly once.
declare(strict_types=1);

function bench_args(array $argv): array
{
    $args = [];
    foreach (array_slice($argv, 1) as $a) {
        [$k, $v] = explode('=', $a, 2) + [1 => '1'];
        $args[ltrim($k, '-')] = $v;
    }
    return $args;
}

function bench_redis(string $url): Redis
{
    $p = parse_url($url);
    $r = new Redis();
    $r->connect($p['host'] ?? '127.0.0.1', (int) ($p['port'] ?? 6379), 2.0);
    $r->setOption(Redis::OPT_READ_TIMEOUT, 5);
    return $r;
}

/** Print one result line: JSON the runner reads. */
function bench_result(array $fields): void
{
    echo json_encode($fields), "\n";
}

/** In the parent of forked consumers: pass SIGTERM on to them and wait until all exit. */
function bench_wait_children(array $pids): void
{
    pcntl_async_signals(true);
    // Not restarting syscalls: the blocking waitpid below must return for the handler to run.
    pcntl_signal(SIGTERM, function () use ($pids) {
        foreach ($pids as $pid) {
            posix_kill($pid, SIGTERM);
        }
    }, false);
    foreach ($pids as $pid) {
        while (pcntl_waitpid($pid, $status) === -1 && pcntl_get_last_error() === PCNTL_EINTR) {
        }
    }
}
