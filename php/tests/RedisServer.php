<?php

declare(strict_types=1);

namespace Delayq\Tests;

use RuntimeException;

/** A private redis-server on a free loopback port, for one test. */
final class RedisServer
{
    public int $port;
    private string $dir;
    /** @var resource|null */
    private $proc;

    public function __construct()
    {
        $sock = stream_socket_server('tcp://127.0.0.1:0');
        $this->port = (int) substr(strrchr(stream_socket_get_name($sock, false), ':'), 1);
        fclose($sock);
        $this->dir = sys_get_temp_dir() . '/delayq-fw-redis-' . getmypid() . '-' . $this->port;
        @mkdir($this->dir);
        $this->proc = proc_open(['redis-server', '--port', (string) $this->port, '--bind', '127.0.0.1',
            '--save', '', '--appendonly', 'no', '--dir', $this->dir],
            [0 => ['file', '/dev/null', 'r'], 1 => ['file', '/dev/null', 'w'], 2 => ['file', '/dev/null', 'w']], $pipes);
        wait_for(10, "redis-server on port {$this->port}", function () {
            $s = @stream_socket_client("tcp://127.0.0.1:{$this->port}", $errno, $error, 0.2);
            if ($s === false) {
                return false;
            }
            fwrite($s, "PING\r\n");
            $pong = fgets($s);
            fclose($s);
            return $pong === "+PONG\r\n";
        });
    }

    public function url(): string
    {
        return "redis://127.0.0.1:{$this->port}";
    }

    public function stop(): void
    {
        if ($this->proc !== null) {
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
