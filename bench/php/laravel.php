<?php
// Laravel's Redis queue (Debian's php-laravel-framework, 8.83), bootstrapped standalone
// the way Illuminate\Queue\Capsule documents it, with phpredis as the client; the same
// protocol as the other bench scripts:
//   php laravel.php push --mode=single --n=N --url=redis://host:port
//   php laravel.php fill --n=N --url=... [--spread=10] --due-file=F
//   php laravel.php consume --url=... --records=DIR [--until-empty] [--sleep-ms=0]
// Jobs are `later()` jobs of a plain handler class ("BenchJob@handle", which deletes its
// job as Laravel asks of such handlers). `consume` runs 4 forked processes, each running
// Laravel's own Worker::runNextJob loop with `--sleep=0.1` (the CLI default is 3 s) and
// one try. Laravel has no delayed bulk push (Queue::bulk pushes for now), so no W1b.
declare(strict_types=1);
require __DIR__ . '/common.php';
require_once 'Illuminate/autoload.php';

use Illuminate\Container\Container;
use Illuminate\Contracts\Debug\ExceptionHandler;
use Illuminate\Events\Dispatcher;
use Illuminate\Queue\Capsule\Manager as QueueCapsule;
use Illuminate\Queue\Worker;
use Illuminate\Queue\WorkerOptions;
use Illuminate\Redis\RedisManager;

const QUEUE = 'default';
const SLEEP_SECONDS = 0.1;

/** The handler: what a Laravel app's "Class@method" job runs. */
final class BenchJob
{
    /** @var callable(int): void */
    public static $handled;

    public function handle($job, array $data): void
    {
        (self::$handled)($data['order_id']);
        $job->delete();
    }
}

/** Failures surface in the bench's output and void the run (missing records). */
final class PrintingExceptionHandler implements ExceptionHandler
{
    public function report(Throwable $e)
    {
        fwrite(STDERR, "laravel job failed: {$e->getMessage()}\n");
    }

    public function shouldReport(Throwable $e)
    {
        return true;
    }

    public function render($request, Throwable $e)
    {
        throw $e;
    }

    public function renderForConsole($output, Throwable $e)
    {
        fwrite(STDERR, (string) $e);
    }
}

function laravel_queue(string $url): QueueCapsule
{
    $p = parse_url($url);
    $container = new Container();
    Container::setInstance($container);
    $container->instance('redis', new RedisManager($container, 'phpredis', [
        'default' => ['host' => $p['host'] ?? '127.0.0.1', 'port' => (int) ($p['port'] ?? 6379), 'database' => 0,
            'read_timeout' => 5],
    ]));
    $capsule = new QueueCapsule($container);
    // Laravel's config/queue.php defaults for the redis connection.
    $capsule->addConnection(['driver' => 'redis', 'connection' => 'default', 'queue' => QUEUE,
        'retry_after' => 90, 'block_for' => null], 'redis');
    $capsule->getContainer()['config']['queue.default'] = 'redis';
    return $capsule;
}

$command = $argv[1] ?? '';
$a = bench_args(array_slice($argv, 1));
$url = $a['url'];

if ($command === 'push') {
    $n = (int) $a['n'];
    $queue = laravel_queue($url)->getConnection('redis');
    $t0 = microtime(true);
    for ($i = 0; $i < $n; $i++) {
        $queue->later(60, 'BenchJob@handle', ['order_id' => $i, 'action' => 'close']);
    }
    $secs = microtime(true) - $t0;
    $stored = bench_redis($url)->zCard('queues:' . QUEUE . ':delayed');
    bench_result(['rate' => $n / $secs, 'seconds' => $secs, 'stored' => $stored, 'expected' => $n]);
    exit(0);
}

if ($command === 'fill') {
    $n = (int) $a['n'];
    $spread = (float) ($a['spread'] ?? 0);
    $queue = laravel_queue($url)->getConnection('redis');
    $lines = [];
    for ($i = 0; $i < $n; $i++) {
        $requested = microtime(true) + ($spread > 0 ? $spread * $i / $n : 0);
        // A DateTime with microseconds, as precise as a caller can ask; Laravel keeps
        // whole seconds of it (availableAt() uses getTimestamp()).
        $at = DateTimeImmutable::createFromFormat('U.u', sprintf('%.6F', $requested));
        $queue->later($at, 'BenchJob@handle', ['order_id' => $i, 'action' => 'close']);
        $lines[] = "$i $requested";
    }
    file_put_contents($a['due-file'], implode("\n", $lines));
    bench_redis($url)->set('bench:filled', '1');
    exit(0);
}

if ($command !== 'consume') {
    fwrite(STDERR, "usage: laravel.php push|fill|consume --url=... (see the header)\n");
    exit(2);
}

$records = $a['records'];
$untilEmpty = isset($a['until-empty']);
$sleepMs = (float) ($a['sleep-ms'] ?? 0);
$pids = [];
for ($p = 0; $p < 4; $p++) {
    $pid = pcntl_fork();
    if ($pid > 0) {
        $pids[] = $pid;
        continue;
    }
    $seen = [];
    $file = "$records/" . getmypid();
    BenchJob::$handled = function (int $orderId) use (&$seen, $sleepMs, $file) {
        if ($sleepMs > 0) {
            usleep((int) ($sleepMs * 1000));
            file_put_contents($file, $orderId . ' ' . microtime(true) . "\n", FILE_APPEND);
            return;
        }
        $seen[] = $orderId . ' ' . microtime(true);
    };
    $capsule = laravel_queue($url);
    $container = $capsule->getContainer();
    $worker = new Worker($capsule->getQueueManager(), new Dispatcher($container), new PrintingExceptionHandler(),
        fn () => false);
    $options = new WorkerOptions('default', 0, 128, 60, SLEEP_SECONDS, 1);
    $stop = false;
    pcntl_async_signals(true);
    pcntl_signal(SIGTERM, function () use (&$stop) { $stop = true; });
    $probe = bench_redis($url);
    $prefix = 'queues:' . QUEUE;
    $nextCheck = 0.0;
    while (!$stop) {
        $worker->runNextJob('redis', QUEUE, $options);
        // Only the bench's end check, at most every 50 ms: Laravel's worker loops forever.
        if ($untilEmpty && microtime(true) >= $nextCheck) {
            $nextCheck = microtime(true) + 0.05;
            if ($probe->exists('bench:filled') && $probe->zCard("$prefix:delayed") === 0
                && $probe->lLen($prefix) === 0 && $probe->zCard("$prefix:reserved") === 0) {
                break;
            }
        }
    }
    if ($seen) {
        file_put_contents($file, implode("\n", $seen));
    }
    exit(0);
}
bench_wait_children($pids);
