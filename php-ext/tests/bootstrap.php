<?php
// Starts a private redis-server on a free loopback port for the whole suite (tests that
// kill Redis start their own); the extension must be loaded (see scripts/test.sh).
declare(strict_types=1);

if (!extension_loaded('delayq')) {
    fwrite(STDERR, "the delayq extension is not loaded: run php -d extension=/path/to/libdelayq_php.so\n");
    exit(1);
}

final class RedisServer
{
    public int $port;
    public string $dir;
    private $proc;

    public function __construct(array $args = [])
    {
        $sock = stream_socket_server('tcp://127.0.0.1:0');
        $this->port = (int) substr(strrchr(stream_socket_get_name($sock, false), ':'), 1);
        fclose($sock);
        $this->dir = sys_get_temp_dir() . '/delayq-php-' . getmypid() . '-' . $this->port;
        @mkdir($this->dir);
        $cmd = array_merge(['redis-server', '--port', (string) $this->port, '--bind', '127.0.0.1',
            '--save', '', '--dir', $this->dir], $args);
        $this->proc = proc_open($cmd, [0 => ['file', '/dev/null', 'r'], 1 => ['file', '/dev/null', 'w'],
            2 => ['file', '/dev/null', 'w']], $pipes);
        $deadline = microtime(true) + 10;
        while (true) {
            try {
                $r = $this->redis();
                if ($r->ping()) {
                    return;
                }
            } catch (Throwable $e) {
            }
            if (microtime(true) > $deadline) {
                throw new RuntimeException("redis-server on port {$this->port} did not start");
            }
            usleep(20000);
        }
    }

    public function url(): string
    {
        return "redis://127.0.0.1:{$this->port}";
    }

    public function redis(): Redis
    {
        $r = new Redis();
        $r->connect('127.0.0.1', $this->port, 1.0);
        return $r;
    }

    public function stop(): void
    {
        if ($this->proc) {
            proc_terminate($this->proc, 9);
            proc_close($this->proc);
            $this->proc = null;
            exec('rm -rf ' . escapeshellarg($this->dir));
        }
    }

    public function __destruct()
    {
        $this->stop();
    }
}

$GLOBALS['DELAYQ_REDIS'] = new RedisServer();

/** The php binary with the extension, for worker scripts run as child processes. */
function delayq_php_command(): array
{
    $ext = getenv('DELAYQ_EXTENSION');
    $cmd = [PHP_BINARY];
    if ($ext) {
        $cmd[] = '-d';
        $cmd[] = "extension=$ext";
    }
    return $cmd;
}

function delayq_wait_for(float $seconds, string $what, callable $cond): void
{
    $deadline = microtime(true) + $seconds;
    while (!$cond()) {
        if (microtime(true) > $deadline) {
            throw new RuntimeException("timed out waiting for $what");
        }
        usleep(10000);
    }
}
