<?php

declare(strict_types=1);

namespace Delayq\Tests\Laravel;

use RuntimeException;

use function Delayq\Tests\php_command;
use function Delayq\Tests\wait_for;

/**
 * A copy of the test application (tests/Laravel/app) in a temporary directory, with a
 * vendor/ as Composer would leave it: vendor/autoload.php, and vendor/composer/installed.json
 * listing this package from php/composer.json, so that package discovery registers
 * DelayqServiceProvider. Its artisan runs as a child process, as in production.
 */
final class LaravelApp
{
    public string $dir;
    public string $log;
    /** @var array<string, string> */
    private array $env;
    /** @var list<array{proc: resource, pid: int}> */
    private array $running = [];
    /** Background artisan processes started so far, which name their log files. */
    private int $started = 0;

    /** @param array<string, string> $env */
    public function __construct(string $redisUrl, array $env = [])
    {
        $this->dir = sys_get_temp_dir() . '/delayq-laravel-' . getmypid() . '-' . bin2hex(random_bytes(4));
        $source = __DIR__ . '/app';
        exec('cp -r ' . escapeshellarg($source) . ' ' . escapeshellarg($this->dir), $out, $rc);
        if ($rc !== 0) {
            throw new RuntimeException("cannot copy the test application to {$this->dir}");
        }
        foreach (['bootstrap/cache', 'storage/framework/cache/data', 'storage/logs', 'database/migrations', 'vendor/composer'] as $sub) {
            @mkdir("{$this->dir}/$sub", 0777, true);
        }
        touch("{$this->dir}/database/database.sqlite");
        file_put_contents("{$this->dir}/vendor/autoload.php",
            "<?php\nrequire " . var_export(dirname(__DIR__) . '/autoload.php', true) . ";\n");
        $package = json_decode((string) file_get_contents(dirname(__DIR__, 2) . '/composer.json'), true);
        file_put_contents("{$this->dir}/vendor/composer/installed.json",
            json_encode(['packages' => [$package]], JSON_PRETTY_PRINT | JSON_UNESCAPED_SLASHES));
        $this->log = "{$this->dir}/storage/runs.log";
        touch($this->log);
        $this->env = ['DELAYQ_URL' => $redisUrl, 'DELAYQ_TEST_LOG' => $this->log] + $env;
    }

    /**
     * Runs artisan to its end.
     *
     * @param list<string> $args
     * @param list<string>|null $php the php command, if not php_command()
     * @return array{int, string, string} exit code, stdout, stderr
     */
    public function artisan(array $args, array $env = [], ?array $php = null): array
    {
        $proc = $this->open($args, $env, $pipes, $php);
        $stdout = stream_get_contents($pipes[1]);
        $stderr = stream_get_contents($pipes[2]);
        fclose($pipes[1]);
        fclose($pipes[2]);
        return [proc_close($proc), (string) $stdout, (string) $stderr];
    }

    /** Runs artisan to its end and fails unless it exits with 0. */
    public function mustRun(array $args, array $env = []): string
    {
        [$code, $out, $err] = $this->artisan($args, $env);
        if ($code !== 0) {
            throw new RuntimeException('artisan ' . implode(' ', $args) . " exited with $code:\n$out\n$err");
        }
        return $out;
    }

    /**
     * Starts artisan in the background (stdout and stderr to files in storage/logs).
     *
     * @param list<string> $args
     * @return int the pid of its php process
     */
    public function start(array $args, array $env = []): int
    {
        $name = preg_replace('/\W+/', '-', implode(' ', $args)) . '-' . $this->started++;
        $proc = proc_open(
            array_merge(php_command(), ["{$this->dir}/artisan"], $args),
            [0 => ['file', '/dev/null', 'r'],
             1 => ['file', "{$this->dir}/storage/logs/$name.out", 'w'],
             2 => ['file', "{$this->dir}/storage/logs/$name.err", 'w']],
            $pipes, $this->dir, $this->environment($env));
        $pid = proc_get_status($proc)['pid'];
        $this->running[] = ['proc' => $proc, 'pid' => $pid];
        return $pid;
    }

    public function isRunning(int $pid): bool
    {
        foreach ($this->running as $r) {
            if ($r['pid'] === $pid) {
                return proc_get_status($r['proc'])['running'];
            }
        }
        return false;
    }

    /** Waits for a background artisan to end; returns its exit code. */
    public function waitFor(int $pid, float $seconds): int
    {
        foreach ($this->running as $i => $r) {
            if ($r['pid'] === $pid) {
                $code = -1;
                wait_for($seconds, "artisan process $pid to end", function () use ($r, &$code) {
                    $s = proc_get_status($r['proc']);
                    $code = $s['running'] ? -1 : ($s['signaled'] ? 128 + $s['termsig'] : $s['exitcode']);
                    return !$s['running'];
                });
                proc_close($r['proc']);
                unset($this->running[$i]);
                return $code;
            }
        }
        throw new RuntimeException("no artisan process $pid");
    }

    /** What the background artisan processes printed, for failure messages. */
    public function output(): string
    {
        $text = '';
        foreach (glob("{$this->dir}/storage/logs/*") ?: [] as $file) {
            $text .= '--- ' . basename($file) . "\n" . file_get_contents($file);
        }
        return $text;
    }

    /** @return list<array{label: string, event: string, attempt: int, at: float, pid: int, job_id: ?string}> */
    public function runs(): array
    {
        $lines = array_filter(explode("\n", (string) file_get_contents($this->log)));
        return array_values(array_map(fn ($l) => json_decode($l, true), $lines));
    }

    /** @return list<array<string, mixed>> the rows of Laravel's failed_jobs table */
    public function failedJobs(): array
    {
        $pdo = new \PDO('sqlite:' . $this->dir . '/database/database.sqlite');
        return $pdo->query('SELECT * FROM failed_jobs ORDER BY id')->fetchAll(\PDO::FETCH_ASSOC);
    }

    public function destroy(): void
    {
        foreach ($this->running as $r) {
            @posix_kill($r['pid'], SIGKILL);
            proc_close($r['proc']);
        }
        $this->running = [];
        exec('rm -rf ' . escapeshellarg($this->dir));
    }

    /** @return resource */
    private function open(array $args, array $env, ?array &$pipes, ?array $php)
    {
        return proc_open(array_merge($php ?? php_command(), ["{$this->dir}/artisan"], $args),
            [0 => ['file', '/dev/null', 'r'], 1 => ['pipe', 'w'], 2 => ['pipe', 'w']],
            $pipes, $this->dir, $this->environment($env));
    }

    /** @param array<string, ?string> $env a null value unsets the variable */
    private function environment(array $env): array
    {
        return array_filter($env + $this->env + getenv(), fn ($value) => $value !== null);
    }
}
