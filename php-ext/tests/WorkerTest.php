<?php
declare(strict_types=1);

use PHPUnit\Framework\TestCase;

final class WorkerTest extends TestCase
{
    private DelayQueue $q;
    private Redis $redis;
    private string $log;

    protected function setUp(): void
    {
        $server = $GLOBALS['DELAYQ_REDIS'];
        $this->redis = $server->redis();
        $this->redis->flushAll();
        $this->q = new DelayQueue($server->url(), 'jobs');
        $this->log = tempnam(sys_get_temp_dir(), 'delayq-log-');
        unlink($this->log);
    }

    protected function tearDown(): void
    {
        foreach (['', '.starts', '.stops', '.summary', '.stderr', '.shutdown-ran'] as $suffix) {
            @unlink($this->log . $suffix);
        }
    }

    private function fill(int $n, array $extra = []): void
    {
        $items = [];
        for ($i = 0; $i < $n; $i++) {
            $items[] = ['payload' => ['n' => $i] + ($extra[$i] ?? [])];
        }
        $this->q->pushMany($items);
    }

    /** @return resource */
    private function startWorker(array $options)
    {
        $cmd = array_merge(delayq_php_command(), [__DIR__ . '/worker_script.php', $GLOBALS['DELAYQ_REDIS']->url(),
            'jobs', $this->log, json_encode($options)]);
        $proc = proc_open($cmd, [0 => ['file', '/dev/null', 'r'], 1 => ['file', '/dev/null', 'w'],
            2 => ['file', "{$this->log}.stderr", 'w']], $pipes);
        $this->assertIsResource($proc);
        return $proc;
    }

    /** @return list<array{0: int, 1: int, 2: int, 3: int}> n, attempt, pid, partition */
    private function handled(): array
    {
        $lines = @file($this->log, FILE_IGNORE_NEW_LINES | FILE_SKIP_EMPTY_LINES) ?: [];
        return array_map(fn ($l) => array_map('intval', explode(' ', $l)), $lines);
    }

    /** Waits for a worker started by startWorker() to end by itself; returns its exit code. */
    private function waitForExit($proc, string $what): int
    {
        $exit = null;
        delayq_wait_for(20, $what, function () use ($proc, &$exit) {
            // The first status that shows the exit is the only one that holds its code.
            $status = proc_get_status($proc);
            $exit = $status['running'] ? null : $status['exitcode'];
            return !$status['running'];
        });
        proc_close($proc);
        return $exit;
    }

    /** The summary that worker_script.php wrote when run() returned. */
    private function summary(): array
    {
        return json_decode((string) file_get_contents("{$this->log}.summary"), true);
    }

    private function drained(): bool
    {
        $s = $this->q->stats();
        return $s['ready'] + $s['scheduled'] + $s['inflight'] === 0;
    }

    private function assertEveryMessageHandled(int $n, int $maxDuplicates): void
    {
        $counts = array_count_values(array_column($this->handled(), 0));
        $missing = array_diff(range(0, $n - 1), array_keys($counts));
        $this->assertSame([], array_values($missing), 'lost messages');
        $duplicates = array_sum($counts) - count($counts);
        $this->assertLessThanOrEqual($maxDuplicates, $duplicates, "$duplicates duplicates");
    }

    public function testHandlerExceptionsRetryThenDeadLetterWithTheError(): void
    {
        $bad = $this->q->push(['bad' => true]);
        $good = $this->q->push(['bad' => false]);
        $attempts = [];
        $w = new DelayQueueWorker($this->q, ['max_attempts' => 3, 'backoff_base' => 0.05, 'backoff_max' => 0.2]);
        $summary = $w->run(function ($payload, DelayQueueMessage $m) use (&$attempts, $w) {
            $this->assertGreaterThanOrEqual($m->dueAt, microtime(true) + 0.002, 'never early');
            $this->assertSame('jobs', $m->queue);
            if ($payload['bad']) {
                $attempts[] = $m->attempt;
                if ($m->attempt === 3) {
                    $w->stop();
                }
                throw new DomainException("cannot close order (attempt {$m->attempt})");
            }
        });
        $this->assertSame([1, 2, 3], $attempts);
        $this->assertSame(['handled' => 4, 'acked' => 1, 'failed' => 3, 'retried' => 2, 'dead' => 1],
            array_intersect_key($summary, array_flip(['handled', 'acked', 'failed', 'retried', 'dead'])));
        $this->assertSame('stop', $summary['stopped_by']);
        $info = $this->q->get($bad);
        $this->assertSame('dead', $info['state']);
        $this->assertSame(3, $info['attempts']);
        $this->assertStringStartsWith('DomainException: cannot close order (attempt 3) in ', $info['last_error']);
        $this->assertStringContainsString('gave up after 3 attempts', $info['last_error']);
        $this->assertNull($this->q->get($good));
        $dead = $this->q->deadLetters();
        $this->assertCount(1, $dead);
        $this->assertSame(['bad' => true], $dead[0]['payload']);
        $this->assertSame(1, $this->q->requeueDead());
        $this->assertSame('ready', $this->q->get($bad)['state']);
    }

    public function testAHandlerThatReturnsAGeneratorFailsItsDeliveryInsteadOfAcknowledgingIt(): void
    {
        $id = $this->q->push(['n' => 1], 0, ['max_attempts' => 1]);
        $ran = false;
        $w = new DelayQueueWorker($this->q, ['stop_when_empty' => true]);
        $summary = $w->run(function ($payload) use (&$ran) {
            $ran = true;
            yield $payload;
        });
        $this->assertFalse($ran, 'a generator body runs only when iterated');
        $this->assertSame([0, 1], [$summary['acked'], $summary['dead']]);
        $info = $this->q->get($id);
        $this->assertSame('dead', $info['state']);
        $this->assertStringContainsString('the handler returned a Generator', $info['last_error']);
    }

    /** @return array<string, array{0: callable(RecordingHandler): callable}> */
    public static function handlerKinds(): array
    {
        return [
            'closure' => [fn (RecordingHandler $r) => function ($payload, DelayQueueMessage $m) use ($r) {
                $r->record($payload, $m);
            }],
            'arrow function' => [fn (RecordingHandler $r) => fn ($payload, $m) => $r->record($payload, $m)],
            'named function' => [function (RecordingHandler $r) {
                RecordingHandler::$current = $r;
                return 'delayq_test_recording_handler';
            }],
            'static method by name' => [function (RecordingHandler $r) {
                RecordingHandler::$current = $r;
                return 'RecordingHandler::handleStatic';
            }],
            'method array' => [fn (RecordingHandler $r) => [$r, 'handle']],
            'invokable object' => [fn (RecordingHandler $r) => $r],
            'first-class callable' => [fn (RecordingHandler $r) => $r->handle(...)],
            '__call' => [fn (RecordingHandler $r) => [$r, 'viaMagic']],
        ];
    }

    /** @dataProvider handlerKinds */
    public function testEveryKindOfCallableHandlesEachMessageWithItsOwnArguments(callable $make): void
    {
        $this->fill(5);
        $recorder = new RecordingHandler();
        $seen = [];
        $w = new DelayQueueWorker($this->q, ['threads' => 1, 'stop_when_empty' => true,
            'on_failure' => function ($payload, $m, Throwable $e) use (&$seen) {
                $seen[] = $e->getMessage();
            }]);
        $summary = $w->run($make($recorder));
        $this->assertSame([], $seen);
        $this->assertSame([5, 0], [$summary['acked'], $summary['failed']]);
        sort($recorder->got);
        $this->assertSame(['0 1', '1 1', '2 1', '3 1', '4 1'], $recorder->got, 'each payload once, with its own message');
        // The same callable again, throwing: the exception reaches the worker each time.
        $this->fill(2);
        $recorder->throw = true;
        $w = new DelayQueueWorker($this->q, ['threads' => 1, 'stop_when_empty' => true, 'max_attempts' => 1]);
        $summary = $w->run($make($recorder));
        $this->assertSame([0, 2, 2], [$summary['acked'], $summary['failed'], $summary['dead']]);
        $this->assertStringContainsString('RuntimeException: refused', $this->q->deadLetters()[0]['last_error']);
    }

    public function testAHandlerArrayHoldingAReferenceCallsWhatTheReferenceHoldsNow(): void
    {
        // [&$h, 'handle'] calls the object $h holds at each call, as call_user_func
        // would, and the object it held before may be freed meanwhile. In a process of
        // its own, as a stale object would crash it.
        foreach ([1, 2, 3] as $n) {
            $this->q->push(['n' => $n]);
        }
        $code = <<<'PHP'
            final class H
            {
                public function __construct(public string $name) {}
                public function handle(mixed $payload): void
                {
                    global $h, $seen;
                    $seen[] = $this->name;
                    $h = new H('replaced ' . count($seen));
                    gc_collect_cycles();
                }
            }
            $h = new H('first');
            $seen = [];
            $w = new DelayQueueWorker(new DelayQueue($argv[1], 'jobs'), ['threads' => 1, 'stop_when_empty' => true]);
            $s = $w->run([&$h, 'handle']);
            echo json_encode([$s['acked'], $seen]), "\n";
            PHP;
        $out = [];
        exec(implode(' ', array_map('escapeshellarg', array_merge(delayq_php_command(),
            ['-r', $code, $GLOBALS['DELAYQ_REDIS']->url()]))) . ' 2>&1', $out, $status);
        $this->assertSame(0, $status, implode("\n", $out));
        $this->assertSame(['[3,["first","replaced 1","replaced 2"]]'], $out);
    }

    public function testASignalThatComesAsARunEndsForAnotherReasonIsNotLost(): void
    {
        // The run ends for max_jobs with a SIGTERM just in: the script's own handler
        // (there before run()) gets it, as it would without the extension. Before, it
        // was dropped, and the next run() forgot it.
        $this->q->push(['n' => 1]);
        $code = <<<'PHP'
            pcntl_async_signals(true);
            $got = [];
            pcntl_signal(SIGTERM, function () use (&$got) { $got[] = 'SIGTERM'; });
            $w = new DelayQueueWorker(new DelayQueue($argv[1], 'jobs'), ['max_jobs' => 1]);
            $s = $w->run(function () { posix_kill(getmypid(), SIGTERM); });
            echo json_encode([$s['stopped_by'], $got]), "\n";
            PHP;
        $out = [];
        exec(implode(' ', array_map('escapeshellarg', array_merge(delayq_php_command(),
            ['-r', $code, $GLOBALS['DELAYQ_REDIS']->url()]))) . ' 2>&1', $out, $status);
        $this->assertSame(0, $status, implode("\n", $out));
        $this->assertSame(['["max_jobs",["SIGTERM"]]'], $out);
    }

    public function testAFiberDestroyedWhileItsHandlerIsSuspendedReleasesTheMessage(): void
    {
        // Code may run run() in a Fiber and suspend the handler; a Fiber dropped
        // undecided unwinds with PHP's graceful exit, which is no Throwable. In a
        // process of its own: before, this crashed it.
        $id = $this->q->push(['n' => 1]);
        $code = <<<'PHP'
            $q = new DelayQueue($argv[1], 'jobs');
            $fiber = new Fiber(function () use ($q) {
                (new DelayQueueWorker($q))->run(function ($payload) {
                    Fiber::suspend($payload);
                });
            });
            $held = $fiber->start();
            unset($fiber);
            gc_collect_cycles();
            echo json_encode($held), "\n";
            PHP;
        $out = [];
        exec(implode(' ', array_map('escapeshellarg', array_merge(delayq_php_command(),
            ['-r', $code, $GLOBALS['DELAYQ_REDIS']->url()]))) . ' 2>&1', $out, $status);
        $this->assertSame(0, $status, implode("\n", $out));
        $this->assertSame(['{"n":1}'], $out);
        $info = $this->q->get($id);
        $this->assertSame(['ready', 0], [$info['state'], $info['attempts']], 'released at once, uncounted');
    }

    public function testAFailureKeepsTheExceptionWithItsStackTraceAndPreviousOnes(): void
    {
        $id = $this->q->push(['order' => 10086]);
        $closeOrder = function (array $payload): void {
            try {
                throw new PDOException('MySQL server has gone away');
            } catch (PDOException $e) {
                throw new RuntimeException("cannot close order {$payload['order']}", 0, $e);
            }
        };
        $w = new DelayQueueWorker($this->q, ['max_attempts' => 1, 'stop_when_empty' => true]);
        $w->run(function ($payload) use ($closeOrder) {
            $closeOrder($payload);
        });
        $info = $this->q->get($id);
        $this->assertSame('dead', $info['state']);
        $this->assertStringStartsWith('RuntimeException: cannot close order 10086 in ' . __FILE__, $info['last_error']);
        $trace = $info['error_trace'];
        $this->assertIsString($trace);
        // (string) $e: the previous exception first, then "Next" the one thrown, each
        // with its stack trace.
        $this->assertStringStartsWith('PDOException: MySQL server has gone away in ' . __FILE__, $trace);
        $this->assertStringContainsString("\nNext RuntimeException: cannot close order 10086 in " . __FILE__, $trace);
        $this->assertStringContainsString('Stack trace:', $trace);
        // Arguments show unless zend.exception_ignore_args is on (as Debian's php.ini has it).
        $this->assertStringContainsString(__FILE__ . '(' , $trace);
        // PHP 8.4 names a closure's frame after where it was defined: {closure:Class::method():line}.
        $this->assertMatchesRegularExpression('/' . __CLASS__ . '->\{closure(:[^}]+)?\}\(/', $trace);
        $this->assertStringContainsString('DelayQueueWorker->run(', $trace);
        $this->assertSame($trace, $this->q->deadLetters()[0]['error_trace']);
        $this->assertNull($this->q->get($this->q->push(['order' => 1]))['error_trace']);

        // Cut to max_trace_bytes, keeping the start and the end; 0 keeps none.
        foreach ([300 => true, 0 => false] as $max => $kept) {
            $id = $this->q->push(['order' => $max]);
            $w = new DelayQueueWorker($this->q, ['max_attempts' => 1, 'stop_when_empty' => true,
                'max_trace_bytes' => $max]);
            $w->run(function ($payload) use ($id, $closeOrder) {
                if ($payload['order'] !== 1) {
                    $closeOrder($payload);
                }
            });
            $info = $this->q->get($id);
            $this->assertStringStartsWith('RuntimeException: ', $info['last_error']);
            if ($kept) {
                $this->assertLessThanOrEqual(300, strlen($info['error_trace']));
                $this->assertStringStartsWith('PDOException: MySQL server has gone away', $info['error_trace']);
                $this->assertStringContainsString('bytes left out', $info['error_trace']);
                $this->assertStringEndsWith('{main}', $info['error_trace']);
            } else {
                $this->assertNull($info['error_trace']);
            }
        }
        foreach ([-1, 1048577] as $bad) {
            try {
                new DelayQueueWorker($this->q, ['max_trace_bytes' => $bad]);
                $this->fail("accepted max_trace_bytes $bad");
            } catch (DelayQueueInvalidArgumentException $e) {
                $this->assertStringContainsString('max_trace_bytes', $e->getMessage());
            }
        }
    }

    public function testAPayloadPastMaxPayloadBytesIsDeadLetteredUnread(): void
    {
        $small = $this->q->push(['order' => 1]);
        $big = $this->q->push(['blob' => str_repeat('x', 10000)]);
        $seen = [];
        $w = new DelayQueueWorker($this->q, ['stop_when_empty' => true, 'max_payload_bytes' => 1000]);
        $summary = $w->run(function ($payload, DelayQueueMessage $m) use (&$seen) {
            $seen[] = $m->id;
        });
        $this->assertSame([$small], $seen, 'the handler never got the big one');
        $this->assertSame([1, 0], [$summary['handled'], $summary['failed']]);
        $dead = $this->q->deadLetters();
        $this->assertCount(1, $dead);
        $this->assertSame($big, $dead[0]['id']);
        $this->assertStringEndsWith("bytes is past this worker's max_payload_bytes (1000): not loaded",
            $dead[0]['last_error']);
        // The default bound hands it out.
        $this->q->requeueDead($big);
        (new DelayQueueWorker($this->q, ['stop_when_empty' => true]))->run(
            function ($payload, DelayQueueMessage $m) use (&$seen) {
                $seen[] = $m->id;
            });
        $this->assertSame([$small, $big], $seen);
        foreach ([0, 536870913] as $bad) {
            try {
                new DelayQueueWorker($this->q, ['max_payload_bytes' => $bad]);
                $this->fail("accepted max_payload_bytes $bad");
            } catch (DelayQueueInvalidArgumentException $e) {
                $this->assertStringContainsString('max_payload_bytes', $e->getMessage());
            }
        }
    }

    public function testAnExceptionWhoseToStringThrowsStillLeavesItsTraceAndThePoolGoesOn(): void
    {
        $bad = $this->q->push(['n' => 1]);
        $next = $this->q->push(['n' => 2]);
        $handled = [];
        $w = new DelayQueueWorker($this->q, ['max_attempts' => 1, 'stop_when_empty' => true]);
        $w->run(function (array $p) use (&$handled) {
            $handled[] = $p['n'];
            if ($p['n'] === 1) {
                throw new class ('order 1 is broken') extends RuntimeException {
                    public function __toString(): string
                    {
                        throw new LogicException('cannot print myself');
                    }
                };
            }
        });
        $this->assertSame([1, 2], $handled, 'the pool went on');
        $info = $this->q->get($bad);
        $this->assertSame('dead', $info['state']);
        $this->assertStringContainsString('order 1 is broken in ' . __FILE__, $info['error_trace']);
        $this->assertStringContainsString("\nStack trace:\n#0 ", $info['error_trace']);
        $this->assertNull($this->q->get($next));
    }

    public function testNoRetryClassesGoToTheDeadLettersAtOnce(): void
    {
        $invalid = $this->q->push(['kind' => 'invalid']);
        $flaky = $this->q->push(['kind' => 'flaky']);
        $calls = [];
        $w = new DelayQueueWorker($this->q, ['max_attempts' => 3, 'backoff_base' => 0.01, 'backoff_max' => 0.01,
            'no_retry' => [LogicException::class, '\JsonException']]);
        $summary = $w->run(function (array $payload, DelayQueueMessage $m) use (&$calls, $w) {
            $calls[] = $payload['kind'];
            if ($m->attempt === 3) {
                $w->stop();  // the last attempt of the other one: every failure is in
            }
            throw $payload['kind'] === 'invalid'
                ? new InvalidArgumentException('order 10086 has no customer')  // a LogicException
                : new RuntimeException('gateway timeout');
        });
        $this->assertSame(1, count(array_keys($calls, 'invalid')), 'not retried');
        $this->assertSame(3, count(array_keys($calls, 'flaky')), 'retried as usual');
        $this->assertSame(2, $summary['dead']);
        $info = $this->q->get($invalid);
        $this->assertSame(['dead', 1], [$info['state'], $info['attempts']]);
        $this->assertStringStartsWith('InvalidArgumentException: order 10086 has no customer in ', $info['last_error']);
        $this->assertStringNotContainsString('gave up', $info['last_error']);
        $this->assertStringContainsString('Stack trace:', $info['error_trace']);
        $this->assertStringContainsString('gave up after 3 attempts', $this->q->get($flaky)['last_error']);

        foreach ([[['NoSuchException'], DelayQueueInvalidArgumentException::class, 'does not exist'],
                     [[stdClass::class], DelayQueueInvalidArgumentException::class, 'not an exception class'],
                     [[42], TypeError::class, 'item 0 is int'],
                     ['LogicException', TypeError::class, 'must be an array']] as [$bad, $class, $text]) {
            try {
                new DelayQueueWorker($this->q, ['no_retry' => $bad]);
                $this->fail('accepted no_retry ' . json_encode($bad));
            } catch (Throwable $e) {
                $this->assertInstanceOf($class, $e);
                $this->assertStringContainsString("'no_retry'", $e->getMessage());
                $this->assertStringContainsString($text, $e->getMessage());
            }
        }
    }

    public function testOnDeadAlertsForEachMessageSentToTheDeadLetters(): void
    {
        foreach (['fine', 'broken', 'gone', 'alarm'] as $kind) {
            $this->q->push(['kind' => $kind]);
        }
        $deaths = [];
        $w = new DelayQueueWorker($this->q, ['max_attempts' => 1, 'stop_when_empty' => true,
            'on_dead' => function (array $payload, DelayQueueMessage $m, string $error) use (&$deaths) {
                $deaths[] = [$payload['kind'], $m->attempt, $error];
                if ($payload['kind'] === 'alarm') {
                    throw new RuntimeException('the pager is down');
                }
            }]);
        $summary = $w->run(function (array $payload, DelayQueueMessage $m) {
            if ($payload['kind'] === 'gone') {
                $m->deadLetter('order 42 no longer exists');
            } elseif ($payload['kind'] !== 'fine') {
                throw new LogicException("cannot handle {$payload['kind']}");
            }
        });
        sort($deaths);
        $this->assertSame([['alarm', 1], ['broken', 1], ['gone', 1]], array_map(fn ($d) => [$d[0], $d[1]], $deaths));
        $this->assertStringStartsWith('LogicException: cannot handle alarm in ', $deaths[0][2]);
        $this->assertStringStartsWith('LogicException: cannot handle broken in ', $deaths[1][2]);
        $this->assertSame('order 42 no longer exists', $deaths[2][2]);
        $this->assertSame([3, 1, 'empty'], [$summary['dead'], $summary['acked'], $summary['stopped_by']],
            'the pool went on after on_dead threw');
        try {
            new DelayQueueWorker($this->q, ['on_dead' => 'no_such_function']);
            $this->fail('a non-callable on_dead was accepted');
        } catch (TypeError $e) {
            $this->assertStringContainsString('on_dead', $e->getMessage());
        }
    }

    public function testOnFailureGetsEachExceptionAHandlerThrew(): void
    {
        foreach (['fine', 'flaky', 'broken', 'gone'] as $kind) {
            $this->q->push(['kind' => $kind]);
        }
        $reports = [];
        $calls = 0;
        $w = null;
        $w = new DelayQueueWorker($this->q, ['max_attempts' => 2, 'backoff_base' => 0.1, 'backoff_max' => 0.1,
            'threads' => 1,
            'on_failure' => function (array $payload, DelayQueueMessage $m, Throwable $e) use (&$reports) {
                $reports[] = [$payload['kind'], $m->attempt, get_class($e), $e->getMessage()];
                if ($payload['kind'] === 'broken' && $m->attempt === 1) {
                    throw new RuntimeException('the error tracker is down');
                }
            }]);
        $summary = $w->run(function (array $payload, DelayQueueMessage $m) use (&$calls, &$w) {
            // fine once, flaky twice, broken twice, gone once.
            if (++$calls === 6) {
                $w->stop();
            }
            match ($payload['kind']) {
                'flaky' => $m->attempt === 1 ? throw new DomainException('payment gateway timeout') : null,
                'broken' => throw new LogicException('no such order'),
                'gone' => $m->deadLetter('order 42 no longer exists'),
                default => null,
            };
        });
        sort($reports);
        $this->assertSame([
            ['broken', 1, 'LogicException', 'no such order'],
            ['broken', 2, 'LogicException', 'no such order'],
            ['flaky', 1, 'DomainException', 'payment gateway timeout'],
        ], $reports, 'a decision without an exception (deadLetter) is no failure report');
        $this->assertSame([2, 4, 2], [$summary['acked'], $summary['failed'], $summary['retried']],
            'the pool went on after on_failure threw');
        try {
            new DelayQueueWorker($this->q, ['on_failure' => 42]);
            $this->fail('a non-callable on_failure was accepted');
        } catch (TypeError $e) {
            $this->assertStringContainsString("'on_failure' must be callable", $e->getMessage());
        }
    }

    public function testAHandlerDecidesWhenToRetryOrToGiveUp(): void
    {
        $later = $this->q->push(['kind' => 'later']);
        $hopeless = $this->q->push(['kind' => 'hopeless']);
        $raised = $this->q->push(['kind' => 'raised']);
        $tries = [];
        $refused = [];
        // A backoff of at least 15 s: a retry within seconds can only be retryLater's.
        $w = new DelayQueueWorker($this->q, ['max_attempts' => 5, 'backoff_base' => 30.0, 'backoff_max' => 60.0]);
        $summary = $w->run(function (array $p, DelayQueueMessage $m) use ($w, &$tries, &$refused) {
            if ($p['kind'] === 'later') {
                $tries[] = [$m->attempt, microtime(true)];
                if ($m->attempt > 1) {
                    $w->stop();
                    return;
                }
                try {
                    $m->retryLater(-1);
                } catch (DelayQueueInvalidArgumentException $e) {
                    $refused[] = $e->getMessage();
                }
                $m->retryLater(0.3, 'rate limited');
                try {
                    $m->deadLetter();
                } catch (DelayQueueInvalidArgumentException $e) {
                    $refused[] = $e->getMessage();
                }
            } elseif ($p['kind'] === 'hopeless') {
                $m->deadLetter('order 42 no longer exists');   // and returns: not an ack
            } else {
                $m->retryLater(3600);
                throw new RuntimeException('boom');            // the decision wins
            }
        });
        $this->assertCount(2, $refused);
        $this->assertStringContainsString('delay', $refused[0]);
        $this->assertStringContainsString('already', $refused[1]);
        $this->assertSame([1, 2], array_column($tries, 0));
        $gap = $tries[1][1] - $tries[0][1];
        $this->assertGreaterThanOrEqual(0.298, $gap);
        $this->assertLessThan(10, $gap, "its own delay, not the worker's backoff");
        $this->assertSame(['acked' => 1, 'failed' => 3, 'retried' => 2, 'dead' => 1],
            array_intersect_key($summary, array_flip(['acked', 'failed', 'retried', 'dead'])));
        $info = $this->q->get($hopeless);
        $this->assertSame(['dead', 1, 'order 42 no longer exists'], [$info['state'], $info['attempts'], $info['last_error']]);
        $info = $this->q->get($raised);
        $this->assertSame(['scheduled', 1, 'retry requested by the handler'],
            [$info['state'], $info['attempts'], $info['last_error']]);
        $this->assertEqualsWithDelta(microtime(true) + 3600, $info['due_at'], 10);
        $this->assertNull($this->q->get($later));
    }

    public function testDeadLettersAreRequeuedOrDeletedByTheTextOfTheirError(): void
    {
        $ids = [];
        foreach (['refused', 'closed', 'refused', 'coupon'] as $i => $why) {
            $ids[] = $this->q->push(['why' => $why, 'n' => $i], 0, ['max_attempts' => 1]);
        }
        $w = new DelayQueueWorker($this->q, ['stop_when_empty' => true]);
        $w->run(function (array $p) {
            throw match ($p['why']) {
                'refused' => new PDOException("SQLSTATE[HY000] [2002] Connection refused (order {$p['n']})"),
                'closed' => new DomainException("order {$p['n']} is already closed"),
                default => new RuntimeException('the 50% off coupon expired'),
            };
        });
        $this->assertSame(4, $this->q->stats()['dead']);
        $this->assertSame(2, $this->q->requeueDeadWithError('[2002] Connection refused'));
        $this->assertSame(['ready', 'dead', 'ready', 'dead'], array_map(fn ($id) => $this->q->get($id)['state'], $ids));
        $this->assertSame(1, $this->q->deleteDeadWithError('50% off'), 'plain text, not a pattern');
        $this->assertNull($this->q->get($ids[3]));
        $this->assertSame(0, $this->q->requeueDeadWithError('no such error'));
        try {
            $this->q->deleteDeadWithError('');
            $this->fail('an empty text was accepted');
        } catch (DelayQueueInvalidArgumentException $e) {
            $this->assertStringContainsString('text', $e->getMessage());
        }
        $this->assertSame(1, $this->q->stats()['dead']);
    }

    public function testDeadLettersAreDeletedOneOrAllAndNothingElseIsTouched(): void
    {
        $doomed = [];
        for ($i = 0; $i < 3; $i++) {
            $doomed[] = $this->q->push(['doomed' => $i], 0, ['max_attempts' => 1]);
        }
        $waiting = $this->q->push(['later' => true], 3600);
        $w = new DelayQueueWorker($this->q, []);
        $calls = 0;
        // Failures are written before run() returns, so all three are dead by then.
        $w->run(function () use ($w, &$calls) {
            if (++$calls === 3) {
                $w->stop();
            }
            throw new RuntimeException('boom');
        });
        $this->assertSame(3, $this->q->stats()['dead']);
        $this->assertSame(1, $this->q->deleteDead($doomed[1]));
        $this->assertNull($this->q->get($doomed[1]), 'gone, payload and all');
        $this->assertSame(0, $this->q->deleteDead($doomed[1]));
        $this->assertSame(0, $this->q->deleteDead($waiting), 'not a dead letter');
        try {
            $this->q->deleteDead('');
            $this->fail('an empty id was accepted');
        } catch (DelayQueueInvalidArgumentException $e) {
            $this->assertStringContainsString('id', $e->getMessage());
        }
        $this->assertSame(2, $this->q->deleteDead());
        $s = $this->q->stats();
        $this->assertSame([0, 1, 3], [$s['dead'], $s['scheduled'], $s['discarded']]);
        $this->assertSame('scheduled', $this->q->get($waiting)['state']);
    }

    public function testOnStartMaxJobsAndOrderByDueTime(): void
    {
        for ($i = 4; $i >= 0; $i--) {
            $this->q->push($i, 0.05 * $i);
        }
        $started = 0;
        $got = [];
        $w = new DelayQueueWorker($this->q, ['threads' => 1, 'max_jobs' => 5, 'on_start' => function () use (&$started) {
            $started++;
        }]);
        $summary = $w->run(function ($payload) use (&$got) {
            $got[] = $payload;
        });
        $this->assertSame(1, $started);
        $this->assertSame([0, 1, 2, 3, 4], $got);
        $this->assertSame('max_jobs', $summary['stopped_by']);
        $this->assertSame(5, $summary['acked']);
        $this->assertTrue($this->drained());
    }

    public function testStopWhenEmptyReturnsOnceNothingIsDueAndLeavesLaterMessages(): void
    {
        $later = $this->q->push(['n' => 'later'], 3600);
        $this->fill(5);
        $got = [];
        $w = new DelayQueueWorker($this->q, ['stop_when_empty' => true]);
        $summary = $w->run(function ($payload) use (&$got) {
            $got[] = $payload['n'];
        });
        sort($got);
        $this->assertSame([0, 1, 2, 3, 4], $got);
        $this->assertSame('empty', $summary['stopped_by']);
        $this->assertSame('scheduled', $this->q->get($later)['state']);
    }

    public function testStopWhenEmptyEndsASupervisedPool(): void
    {
        $this->fill(6);
        $proc = $this->startWorker(['processes' => 2, 'stop_when_empty' => true]);
        $this->assertSame(0, $this->waitForExit($proc, 'the supervisor returned by itself'));
        $summary = $this->summary();
        $this->assertSame(['empty', 0, 6], [$summary['stopped_by'], $summary['restarts'], $summary['acked']]);
        $this->assertEveryMessageHandled(6, 0);
        $this->assertTrue($this->drained());
    }

    public function testLowerQueuesRunOnlyWhenTheHigherOnesHaveNothingDue(): void
    {
        $url = $GLOBALS['DELAYQ_REDIS']->url();
        $bulk = new DelayQueue($url, 'bulk');
        $reports = new DelayQueue($url, 'reports');
        // The lower queues' messages are older: priority, not due time, decides.
        $reports->pushMany(array_map(fn ($n) => ['payload' => $n], range(0, 99)));
        $bulk->pushMany(array_map(fn ($n) => ['payload' => $n], range(0, 99)));
        $this->q->pushMany(array_map(fn ($n) => ['payload' => $n], range(0, 99)));
        $order = [];
        $w = new DelayQueueWorker($this->q, ['lower_queues' => [$bulk, $reports], 'stop_when_empty' => true]);
        $summary = $w->run(function ($n, DelayQueueMessage $m) use (&$order) {
            $order[] = [$m->queue, $n];
            usleep(100);
        });
        $this->assertSame(['empty', 300, 300], [$summary['stopped_by'], $summary['handled'], $summary['acked']]);
        $queues = array_column($order, 0);
        $lastOf = fn (string $q) => max(array_keys($queues, $q, true));
        $before = fn (string $q, int $end) => count(array_keys(array_slice($queues, 0, $end), $q, true));
        // Only what a lower pool claimed in the first instant may run ahead.
        $this->assertLessThanOrEqual(2, $before('bulk', $lastOf('jobs')) + $before('reports', $lastOf('jobs')));
        $this->assertLessThanOrEqual(2, $before('reports', $lastOf('bulk')));
        foreach (['jobs' => $this->q, 'bulk' => $bulk, 'reports' => $reports] as $name => $queue) {
            $got = array_column(array_filter($order, fn ($e) => $e[0] === $name), 1);
            sort($got);
            $this->assertSame(range(0, 99), $got, "$name: each message once");
            $this->assertSame(100, $queue->stats()['acked'], "$name: acknowledged in its own queue");
        }
    }

    public function testASupervisedPoolConsumesItsLowerQueuesInEveryProcess(): void
    {
        $this->fill(20);
        $low = new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'low');
        $low->pushMany(array_map(fn ($n) => ['payload' => ['n' => $n]], range(0, 19)));
        $proc = $this->startWorker(['processes' => 2, 'stop_when_empty' => true, '_lower' => ['low']]);
        $this->assertSame(0, $this->waitForExit($proc, 'the supervisor returned by itself'));
        $this->assertSame(['empty', 40], [$this->summary()['stopped_by'], $this->summary()['acked']]);
        $lines = file($this->log, FILE_IGNORE_NEW_LINES | FILE_SKIP_EMPTY_LINES);
        $byQueue = [];
        foreach ($lines as $line) {
            [$n, , , , $queue] = explode(' ', $line);
            $byQueue[$queue][] = (int) $n;
        }
        foreach (['jobs', 'low'] as $queue) {
            sort($byQueue[$queue]);
            $this->assertSame(range(0, 19), $byQueue[$queue], "$queue: each message once");
        }
        $this->assertSame(0, $low->stats()['ready']);
    }

    public function testBadLowerQueuesAreRefusedNamingTheOption(): void
    {
        $url = $GLOBALS['DELAYQ_REDIS']->url();
        foreach (['bulk', ['bulk'], [new stdClass()]] as $bad) {
            try {
                new DelayQueueWorker($this->q, ['lower_queues' => $bad]);
                $this->fail('accepted ' . json_encode($bad));
            } catch (TypeError $e) {
                $this->assertStringContainsString("'lower_queues'", $e->getMessage());
            }
        }
        try {
            new DelayQueueWorker($this->q, ['lower_queues' => [new DelayQueue($url, 'jobs')]]);
            $this->fail('accepted the same queue twice');
        } catch (DelayQueueInvalidArgumentException $e) {
            $this->assertStringContainsString('listed twice', $e->getMessage());
        }
    }

    public function testAMessagePastItsExpireAfterIsDeadLetteredUnrun(): void
    {
        // A window wide enough for a new pool to start within it on a loaded machine:
        // the requeue below needs that.
        $stale = $this->q->push('stale', 0, ['expire_after' => 0.9]);
        $this->q->pushMany([['payload' => 'fresh', 'expire_after' => 60], ['payload' => 'plain']]);
        $info = $this->q->get($stale);
        $this->assertEqualsWithDelta(0.9, $info['expires_at'] - $info['due_at'], 0.0005);
        usleep(1200000);   // no worker runs for a while
        $got = [];
        $deadlines = [];
        $w = new DelayQueueWorker($this->q, ['stop_when_empty' => true]);
        $summary = $w->run(function ($payload, DelayQueueMessage $m) use (&$got, &$deadlines) {
            $got[] = $payload;
            $deadlines[$payload] = $m->expiresAt === null ? null : round($m->expiresAt - $m->dueAt, 3);
        });
        sort($got);
        $this->assertSame(['fresh', 'plain'], $got);
        ksort($deadlines);
        $this->assertSame(['fresh' => 60.0, 'plain' => null], $deadlines);
        $this->assertSame(2, $summary['handled']);
        $dead = $this->q->deadLetters();
        $this->assertSame([$stale], array_column($dead, 'id'));
        $this->assertStringStartsWith('expired: not started within 900 ms of its due time', $dead[0]['last_error']);
        // Sent back, it has a fresh deadline and runs.
        $this->assertSame(1, $this->q->requeueDead($stale));
        $got = [];
        $w->run(function ($payload) use (&$got) {
            $got[] = $payload;
        });
        $this->assertSame(['stale'], $got);
        $this->assertTrue($this->drained());
    }

    public function testABadExpireAfterIsRefusedAndWritesNothing(): void
    {
        foreach ([0, -1, 0.0001] as $bad) {
            try {
                $this->q->push('x', 0, ['expire_after' => $bad]);
                $this->fail("accepted expire_after $bad");
            } catch (DelayQueueInvalidArgumentException $e) {
                $this->assertStringContainsString('expire_after', $e->getMessage());
            }
        }
        try {
            $this->q->push('x', 0, ['expire_after' => 'soon']);
            $this->fail('accepted a string');
        } catch (TypeError $e) {
            $this->assertStringContainsString("'expire_after'", $e->getMessage());
        }
        try {
            $this->q->pushMany([['payload' => 1], ['payload' => 2, 'expire_after' => 0]]);
            $this->fail('accepted a batch with a bad item');
        } catch (DelayQueueInvalidArgumentException $e) {
            $this->assertStringContainsString('expire_after of item 1', $e->getMessage());
        }
        $this->assertSame([], $this->redis->keys('*'));
    }

    public function testMaxMemoryEndsTheRun(): void
    {
        $this->fill(50);
        $hoard = [];
        $w = new DelayQueueWorker($this->q, ['max_memory_mb' => intdiv(memory_get_usage(), 1048576) + 8]);
        $summary = $w->run(function () use (&$hoard) {
            $hoard[] = str_repeat('x', 1 << 20);
        });
        $this->assertSame('max_memory', $summary['stopped_by']);
        $this->assertLessThan(50, $summary['acked']);
        $this->assertGreaterThanOrEqual(5, $summary['acked'], 'about 8 MB of headroom');
        $this->assertSame(0, $this->q->stats()['inflight'], 'prefetched messages went back at once');
    }

    public function testMaxTimeEndsAnIdleRun(): void
    {
        $w = new DelayQueueWorker($this->q, ['max_time' => 0.3]);
        $summary = $w->run(function () {
            $this->fail('nothing to handle');
        });
        $this->assertSame('max_time', $summary['stopped_by']);
        foreach ([0, -1, NAN, 'soon'] as $bad) {
            try {
                new DelayQueueWorker($this->q, ['max_time' => $bad]);
                $this->fail('accepted max_time ' . var_export($bad, true));
            } catch (DelayQueueInvalidArgumentException | TypeError $e) {
                $this->assertStringContainsString('max_time', $e->getMessage());
            }
        }
    }

    public function testMaxTimeRecyclesSupervisedProcessesAndLosesNothing(): void
    {
        $this->fill(300);
        $proc = $this->startWorker(['processes' => 2, 'max_time' => 0.4, '_sleep_ms' => 10]);
        delayq_wait_for(30, 'every message handled', fn () => $this->drained());
        delayq_wait_for(10, 'two rounds of recycling', fn () => count(@file("{$this->log}.starts") ?: []) >= 6);
        proc_terminate($proc, SIGTERM);
        $this->assertSame(0, proc_close($proc));
        $summary = $this->summary();
        $this->assertSame('signal', $summary['stopped_by']);
        $this->assertGreaterThanOrEqual(4, $summary['restarts'], 'each ended process was replaced');
        $this->assertSame(300, $summary['acked'], 'summed over the recycled processes');
        $starts = count(file("{$this->log}.starts"));
        $this->assertSame($starts, count(file("{$this->log}.stops")), 'each process stopped gracefully');
        $this->assertEveryMessageHandled(300, 0);
    }

    public function testSigtermStopsGracefullyAndLosesNothing(): void
    {
        $this->fill(500);
        $proc = $this->startWorker(['threads' => 2, 'batch' => 50, 'lease' => 60.0, '_sleep_ms' => 5]);
        delayq_wait_for(20, 'some messages handled', fn () => count($this->handled()) >= 50);
        proc_terminate($proc, SIGTERM);
        $this->assertSame(0, proc_close($proc));
        $summary = $this->summary();
        $this->assertSame('signal', $summary['stopped_by']);
        $this->assertCount(1, file("{$this->log}.stops"), 'on_stop ran once, after the pool stopped');
        $handled = count($this->handled());
        $this->assertSame($handled, $summary['acked'], 'every handled message was acknowledged');
        $stats = $this->q->stats();
        $this->assertSame(0, $stats['inflight'], 'prefetched messages went back at once');
        $this->assertSame(500 - $handled, $stats['ready']);
        // A new worker finishes the rest: nothing was lost.
        $proc = $this->startWorker([]);
        delayq_wait_for(20, 'the rest handled', fn () => $this->drained());
        proc_terminate($proc, SIGTERM);
        proc_close($proc);
        $this->assertEveryMessageHandled(500, 0);
    }

    /** @return array{0: list<int>, 1: int, 2: int} the exit (signal number or code), inflight, ready */
    private function secondSignalStopsAtOnce(array $options): array
    {
        $held = $this->q->push(['n' => 0, 'hold' => true]);
        $this->fill(20);
        // A long lease: what comes back at once was released, not left to expire.
        $proc = $this->startWorker(['lease' => 60.0, 'threads' => 1, '_sleep_ms' => 200] + $options);
        delayq_wait_for(20, 'the handler running', fn () => file_exists("{$this->log}.holding"));
        proc_terminate($proc, SIGTERM);
        usleep(1000 * 1000);
        $this->assertTrue(proc_get_status($proc)['running'], 'the first signal waits for the running handler');
        proc_terminate($proc, SIGTERM);
        $ended = null;
        delayq_wait_for(20, 'the process ended', function () use ($proc, &$ended) {
            $s = proc_get_status($proc);
            if (!$s['running']) {
                $ended = $s['signaled'] ? ['signal', $s['termsig']] : ['code', $s['exitcode']];
            }
            return $ended !== null;
        });
        proc_close($proc);
        $stats = $this->q->stats();
        $this->assertNotSame('completed', $this->q->get($held)['state'] ?? null);
        return [$ended, $stats['inflight'], $stats['ready']];
    }

    public function testASecondSignalGivesEveryHeldMessageBackAndEndsTheProcessByIt(): void
    {
        [$ended, $inflight, $ready] = $this->secondSignalStopsAtOnce([]);
        $this->assertSame(['signal', SIGTERM], $ended, 'ended by the signal, as without a handler');
        $this->assertSame(0, $inflight, 'released at once, not after the 60 s lease');
        $this->assertSame(21 - count($this->handled()), $ready);
        $this->assertStringContainsString('a second stop signal: stopping now;',
            file_get_contents("{$this->log}.stderr"));
    }

    public function testASecondSignalToTheSupervisorStopsEveryProcessAtOnce(): void
    {
        [$ended, $inflight, $ready] = $this->secondSignalStopsAtOnce(['processes' => 2]);
        $this->assertSame(['code', 0], $ended, 'the supervisor returns once its processes ended');
        $this->assertSame(0, $inflight, 'released at once, not after the 60 s lease');
        $this->assertSame(21 - count($this->handled()), $ready);
        $this->assertStringNotContainsString('when their lease ends', file_get_contents("{$this->log}.stderr"),
            'the supervisor does not mistake it for a crash');
        // The summary keeps the counts of the process that ended at once: the held
        // message was handed to its handler and released.
        $summary = $this->summary();
        $this->assertSame(count($this->handled()) + 1, $summary['handled']);
        $this->assertGreaterThanOrEqual(1, $summary['released']);
    }

    public function testMessagesSharingASerialKeyNeverRunAtOnceAcrossProcesses(): void
    {
        $items = [];
        for ($n = 0; $n < 24; $n++) {
            // Every third message belongs to order 10086; the rest to no key.
            $item = ['payload' => ['n' => $n, 'span' => $n % 3 === 0], 'delay' => $n / 1000];
            if ($n % 3 === 0) {
                $item['serial_key'] = 'order:10086';
            }
            $items[] = $item;
        }
        $this->q->pushMany($items);
        $this->assertSame('order:10086', $this->q->waiting(1)[0]['serial_key']);
        // A lease far longer than the run: waiting out a lease would not finish in time.
        $proc = $this->startWorker(['processes' => 3, 'lease' => 60.0, '_sleep_ms' => 30]);
        $held = 0;
        delayq_wait_for(30, 'every message handled', function () use (&$held) {
            $held = max($held, $this->q->stats()['held']);
            return count($this->handled()) === 24 && $this->drained();
        });
        $this->assertGreaterThanOrEqual(1, $held, 'stats() showed a message held for its key');
        $this->assertSame(0, $this->q->stats()['held']);
        proc_terminate($proc, SIGTERM);
        $this->assertSame(0, proc_close($proc));
        $spans = array_map(fn ($line) => array_map('floatval', explode(' ', trim($line))),
            file("{$this->log}.spans"));
        usort($spans, fn ($a, $b) => $a[1] <=> $b[1]);
        $this->assertSame(range(0, 21, 3), array_map(fn ($s) => (int) $s[0], $spans), 'in due order');
        for ($i = 1; $i < count($spans); $i++) {
            $this->assertGreaterThanOrEqual($spans[$i - 1][2], $spans[$i][1],
                "message {$spans[$i][0]} started before {$spans[$i - 1][0]} ended");
        }
        $this->assertGreaterThanOrEqual(2, count(array_unique(array_column($this->handled(), 2))),
            'the other messages spread over the processes');
    }

    public function testTheHandlerSeesItsMessagesSerialKey(): void
    {
        $this->q->pushMany([
            ['payload' => 'keyed', 'serial_key' => 'order:10086'],
            ['payload' => 'plain'],
        ]);
        $keys = [];
        $w = new DelayQueueWorker($this->q, ['stop_when_empty' => true]);
        $summary = $w->run(function ($payload, DelayQueueMessage $m) use (&$keys) {
            $keys[$payload] = $m->serialKey;
        });
        ksort($keys);
        $this->assertSame(['keyed' => 'order:10086', 'plain' => null], $keys);
        $this->assertSame(2, $summary['acked']);
    }

    public function testSigintStopsGracefullyToo(): void
    {
        $this->fill(20);
        $proc = $this->startWorker([]);
        delayq_wait_for(20, 'all handled', fn () => $this->drained());
        proc_terminate($proc, SIGINT);
        $this->assertSame(0, proc_close($proc));
        $this->assertSame('signal', $this->summary()['stopped_by']);
    }

    public function testProcessesModeRestartsAKilledChildAndLosesNothing(): void
    {
        $this->fill(2000);
        $proc = $this->startWorker(['processes' => 3, 'lease' => 1.0, '_sleep_ms' => 1]);
        delayq_wait_for(20, 'three children started', fn () => count(@file("{$this->log}.starts") ?: []) >= 3);
        delayq_wait_for(20, 'a quarter handled', fn () => count($this->handled()) >= 500);
        $victim = (int) trim(file("{$this->log}.starts")[0]);
        posix_kill($victim, SIGKILL);
        $inflight = $this->q->stats()['inflight'];
        delayq_wait_for(30, 'every message handled', fn () => $this->drained());
        proc_terminate($proc, SIGTERM);
        $this->assertSame(0, proc_close($proc));
        $summary = $this->summary();
        $this->assertSame(3, $summary['processes']);
        $this->assertGreaterThanOrEqual(1, $summary['restarts'], 'the killed child was replaced');
        $this->assertGreaterThanOrEqual(4, count(file("{$this->log}.starts")), 'on_start ran in the new child');
        $stops = array_map('intval', file("{$this->log}.stops"));
        $this->assertCount(3, $stops, 'on_stop ran in each child that stopped gracefully');
        $this->assertNotContains($victim, $stops, 'not in the SIGKILLed one');
        $this->assertNotContains($victim, array_slice(array_column($this->handled(), 2), -10));
        $this->assertEveryMessageHandled(2000, $inflight + 3);
        $stderr = (string) file_get_contents("{$this->log}.stderr");
        $this->assertStringContainsString("[delayq warning] worker process $victim was killed by signal 9 (SIGKILL", $stderr,
            'the supervisor says what happened, through error_log()');
    }

    public function testMinProcessesGrowsThePoolWithTheBacklogAndLetsIdleProcessesGo(): void
    {
        $proc = $this->startWorker(['processes' => 3, 'min_processes' => 1, 'scale_cooldown' => 0.3,
            'lease' => 2.0, '_sleep_ms' => 5]);
        delayq_wait_for(20, 'the first process listed', fn () => count($this->q->workers()) === 1);
        // 1 500 messages of 5 ms: 7.5 s for one process, so a backlog for a while.
        $this->fill(1500);
        delayq_wait_for(20, 'three processes', fn () => count($this->q->workers()) === 3);
        delayq_wait_for(30, 'every message handled', fn () => $this->drained());
        delayq_wait_for(20, 'back to one process', fn () => count($this->q->workers()) === 1);
        proc_terminate($proc, SIGTERM);
        $this->assertSame(0, proc_close($proc));
        $summary = $this->summary();
        $this->assertSame(3, $summary['processes']);
        $this->assertGreaterThanOrEqual(2, $summary['scaled_up']);
        $this->assertGreaterThanOrEqual(2, $summary['scaled_down']);
        $this->assertSame(0, $summary['restarts'], 'a process let go is not replaced');
        $this->assertSame(1500, $summary['acked']);
        // A process let go stops as at SIGTERM: its handler finishes, its prefetched
        // messages go back at once, on_stop runs. Nothing is lost or run twice.
        $this->assertEveryMessageHandled(1500, 0);
        $starts = file("{$this->log}.starts", FILE_IGNORE_NEW_LINES);
        $this->assertSame(count($starts), count(file("{$this->log}.stops")));
        $this->assertGreaterThanOrEqual(3, count(array_unique(array_column($this->handled(), 2))));

        foreach ([['min_processes' => 0], ['min_processes' => 4, 'processes' => 3],
                     ['min_processes' => 1, 'processes' => 2, 'scale_cooldown' => 0.01]] as $bad) {
            try {
                new DelayQueueWorker($this->q, $bad);
                $this->fail('accepted ' . json_encode($bad));
            } catch (DelayQueueInvalidArgumentException $e) {
                $this->assertMatchesRegularExpression('/min_processes|scale_cooldown/', $e->getMessage());
            }
        }
    }

    public function testEachProcessOfAPoolIsListedUntilItStops(): void
    {
        $this->assertSame([], $this->q->workers());
        $proc = $this->startWorker(['processes' => 2, 'lease' => 0.6]);
        delayq_wait_for(20, 'two children started', fn () => count(@file("{$this->log}.starts") ?: []) >= 2);
        delayq_wait_for(10, 'both listed', fn () => count($this->q->workers()) === 2);
        $children = array_map('intval', file("{$this->log}.starts"));
        $pools = $this->q->workers();
        sort($children);
        $pids = array_column($pools, 'pid');
        sort($pids);
        $this->assertSame($children, $pids, 'the children, not the supervisor');
        $this->assertSame(gethostname(), $pools[0]['host']);
        $this->assertEqualsWithDelta(microtime(true), $pools[0]['last_seen'], 2.0);
        $this->fill(4);
        $reporting = null;
        delayq_wait_for(10, 'a renewal that reports handler starts', function () use (&$reporting) {
            foreach ($this->q->workers() as $pool) {
                if ($pool['started_recently'] > 0) {
                    $reporting = $pool;
                    return true;
                }
            }
            return false;
        });
        $this->assertGreaterThanOrEqual(0.0, $reporting['lateness_avg']);
        $this->assertLessThanOrEqual($reporting['lateness_max'], $reporting['lateness_avg']);
        $this->assertLessThan(5.0, $reporting['lateness_max'], 'due now, started at once');
        $this->assertIsFloat($reporting['handler_avg']);
        proc_terminate($proc, SIGTERM);
        $this->assertSame(0, proc_close($proc));
        $this->assertSame([], $this->q->workers(), 'each left the list as it stopped');
    }

    public function testAPausedQueueIsNotConsumedUntilResumed(): void
    {
        $this->assertTrue($this->q->pause());
        $this->assertFalse($this->q->pause(), 'paused already');
        $this->assertTrue($this->q->isPaused());
        $this->assertEqualsWithDelta(microtime(true), $this->q->stats()['paused_at'], 2.0);
        $this->fill(5);
        // Longer than the test: only the wake-up that resume() publishes can start the work.
        $proc = $this->startWorker(['processes' => 2, 'idle_check' => 600]);
        delayq_wait_for(20, 'both processes listed', fn () => count($this->q->workers()) === 2);
        usleep(1000000);
        $this->assertSame([], $this->handled(), 'nothing runs while paused');
        $this->assertSame(5, $this->q->stats()['ready']);
        $this->assertTrue($this->q->resume());
        $this->assertFalse($this->q->resume(), 'running already');
        $this->assertFalse($this->q->isPaused());
        $this->assertNull($this->q->stats()['paused_at']);
        delayq_wait_for(20, 'all handled after resume', fn () => count($this->handled()) >= 5);
        proc_terminate($proc, SIGTERM);
        $this->assertSame(0, proc_close($proc));
        $this->assertEveryMessageHandled(5, 0);
        $this->assertTrue($this->drained());
    }

    public function testRestartWorkersStopsEveryRunningProcessGracefully(): void
    {
        $this->fill(3);
        // Longer than the test: only the wake-up that the request publishes reaches idle pools.
        $proc = $this->startWorker(['processes' => 2, 'idle_check' => 600]);
        delayq_wait_for(20, 'all handled', fn () => count($this->handled()) >= 3);
        delayq_wait_for(20, 'both processes listed', fn () => count($this->q->workers()) === 2);
        $this->assertSame(2, $this->q->restartWorkers());
        $this->assertSame(0, $this->waitForExit($proc, 'the supervisor returned'));
        $summary = $this->summary();
        $this->assertSame('restart', $summary['stopped_by']);
        $this->assertSame(0, $summary['restarts'], 'no child was started anew');
        $this->assertSame(3, $summary['acked']);
        $this->assertSame([], $this->q->workers());
        // A worker started after the request runs on.
        $this->q->push(['n' => 3]);
        $proc = $this->startWorker([]);
        delayq_wait_for(20, 'the new worker handled the message', fn () => count($this->handled()) >= 4);
        $this->assertTrue(proc_get_status($proc)['running']);
        proc_terminate($proc, SIGTERM);
        $this->assertSame(0, proc_close($proc));
        $this->assertEveryMessageHandled(4, 0);
    }

    public function testARateLimitHoldsEveryProcessToItAndClearingItWakesThem(): void
    {
        $this->assertNull($this->q->rateLimit());
        $this->q->setRateLimit(2, 3600);
        $this->assertSame(['max' => 2, 'per' => 3600.0], $this->q->rateLimit());
        $this->assertSame(['max' => 2, 'per' => 3600.0], $this->q->stats()['rate_limit']);
        $this->fill(5);
        // Longer than the test: only the wake-up that clearing publishes can go on.
        $proc = $this->startWorker(['processes' => 2, 'idle_check' => 600]);
        delayq_wait_for(20, 'two handled', fn () => count($this->handled()) >= 2);
        usleep(1000000);
        $this->assertCount(2, $this->handled(), 'two per hour, over both processes');
        $this->assertSame(3, $this->q->stats()['ready']);
        $this->assertTrue($this->q->clearRateLimit());
        $this->assertFalse($this->q->clearRateLimit(), 'none left');
        $this->assertNull($this->q->stats()['rate_limit']);
        delayq_wait_for(20, 'the rest handled once the limit is gone', fn () => count($this->handled()) >= 5);
        proc_terminate($proc, SIGTERM);
        $this->assertSame(0, proc_close($proc));
        $this->assertEveryMessageHandled(5, 0);
    }

    public function testABadRateLimitIsRefusedAndWritesNothing(): void
    {
        foreach ([[0, 1.0, 'max'], [-3, 1.0, 'max'], [5, 0.0, 'per'], [5, -1.0, 'per'], [5, NAN, 'per'],
                  [5, 40 * 86400.0, 'per']] as [$max, $per, $culprit]) {
            try {
                $this->q->setRateLimit($max, $per);
                $this->fail("$max per $per was accepted");
            } catch (DelayQueueInvalidArgumentException $e) {
                $this->assertStringContainsString($culprit, $e->getMessage());
            }
        }
        $this->assertNull($this->q->rateLimit());
        $split = new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'split', ['partitions' => 3]);
        try {
            $split->setRateLimit(2);
            $this->fail('2 was split over 3 partitions');
        } catch (DelayQueueInvalidArgumentException $e) {
            $this->assertStringContainsString('3 partitions', $e->getMessage());
        }
        $this->assertNull($split->rateLimit());
        $split->setRateLimit(7, 0.5);
        $this->assertSame(['max' => 7, 'per' => 0.5], $split->rateLimit());
        $this->assertTrue($split->clearRateLimit());
    }

    public function testWaitingAndRunningMessagesAreListed(): void
    {
        $late = $this->q->push(['n' => 'late'], 3600);
        $first = $this->q->push(['n' => 'first']);
        $this->assertSame([$first, $late], array_column($this->q->waiting(), 'id'));
        [$ready] = $this->q->waiting(1);
        $this->assertSame(['ready', ['n' => 'first'], 0, null],
            [$ready['state'], $ready['payload'], $ready['attempts'], $ready['lease_until']]);
        $this->assertSame([], $this->q->inflight());
        $this->assertSame([], $this->q->waiting(0));
        foreach ([-1, 1001] as $limit) {
            try {
                $this->q->inflight($limit);
                $this->fail("limit $limit was accepted");
            } catch (DelayQueueInvalidArgumentException $e) {
                $this->assertStringContainsString('limit', $e->getMessage());
            }
        }

        $seen = [];
        $worker = new DelayQueueWorker($this->q);
        $worker->run(function (array $payload, DelayQueueMessage $msg) use ($worker, &$seen) {
            $seen[] = $this->q->inflight();
            $worker->stop();
            $msg->retryLater(600, 'gateway down');
        });
        $this->assertCount(1, $seen);
        [$running] = $seen[0];
        $this->assertSame([$first, 'inflight', 1], [$running['id'], $running['state'], $running['attempts']]);
        $this->assertGreaterThan(microtime(true), $running['lease_until']);
        $this->assertSame([], $this->q->inflight());
        $retry = $this->q->waiting()[0];
        $this->assertSame([$first, 'scheduled', 1, 'gateway down'],
            [$retry['id'], $retry['state'], $retry['attempts'], $retry['last_error']]);
    }

    public function testARepeatingMessageRunsOncePerOccurrence(): void
    {
        $due = $this->q->repeat('tick', 1, ['n' => 1]);
        $this->assertGreaterThan(microtime(true), $due);
        $this->assertSame($due, $this->q->repeat('tick', 1, ['n' => 1]), 'the same definition changes nothing');
        $this->assertSame([['name' => 'tick', 'schedule' => 1.0, 'tz' => null, 'payload' => ['n' => 1],
            'max_attempts' => null, 'expire_after' => null, 'next_due_at' => $due]], $this->q->repeats());
        $seen = [];
        $worker = new DelayQueueWorker($this->q);
        $worker->run(function (array $payload, DelayQueueMessage $msg) use ($worker, &$seen) {
            $seen[] = $msg->id;
            if (count($seen) === 2) {
                $worker->stop();
            }
        });
        $first = (int) round($due * 1000);
        $this->assertSame(["repeat:tick:$first", 'repeat:tick:' . ($first + 1000)], $seen);
        $this->assertTrue($this->q->unrepeat('tick'));
        $this->assertFalse($this->q->unrepeat('tick'));
        $this->assertSame([], $this->q->repeats());

        $next = $this->q->repeat('nightly', '0 2 * * *', ['report' => true],
            ['tz' => 'Asia/Shanghai', 'max_attempts' => 2, 'expire_after' => 600]);
        [$nightly] = $this->q->repeats();
        $this->assertSame(['0 2 * * *', 'Asia/Shanghai', 2, 600.0],
            [$nightly['schedule'], $nightly['tz'], $nightly['max_attempts'], $nightly['expire_after']]);
        $this->assertSame('18:00', gmdate('H:i', (int) $nightly['next_due_at']), '02:00 in Shanghai');
        $occurrence = $this->q->get('repeat:nightly:' . (int) round($next * 1000));
        $this->assertEqualsWithDelta($next + 600, $occurrence['expires_at'], 0.0005, 'its deadline counts from its due time');

        foreach ([
            [['x', '61 * * * *', 1], 'not a cron pattern'],
            [['x', '0 2 * * *', 1, ['tz' => 'Mars/Base']], 'IANA time zone'],
            [['x', 60, 1, ['tz' => 'UTC']], 'not to intervals'],
            [['x', 0.5, 1], '1 second'],
            [['x', [60], 1], '$schedule must be a cron pattern'],
            [['', 60, 1], 'repeat name'],
            [['x', 60, 1, ['zt' => 'UTC']], "unknown repeat option 'zt'"],
            [['x', 60, 1, ['expire_after' => 0]], 'expire_after'],
        ] as [$args, $text]) {
            try {
                $this->q->repeat(...$args);
                $this->fail('accepted: ' . json_encode($args));
            } catch (DelayQueueInvalidArgumentException $e) {
                $this->assertStringContainsString($text, $e->getMessage());
            }
        }
        $this->assertCount(1, $this->q->repeats(), 'nothing written by bad input');
    }

    public function testAHungHandlerIsKilledAndItsMessageDeliveredAgain(): void
    {
        $this->fill(50, [3 => ['hang' => true]]);
        $proc = $this->startWorker(['processes' => 2, 'timeout' => 0.5, 'lease' => 1.0]);
        delayq_wait_for(30, 'every message handled', fn () => $this->drained());
        proc_terminate($proc, SIGTERM);
        $this->assertSame(0, proc_close($proc));
        $summary = $this->summary();
        $this->assertSame(1, $summary['killed_hung']);
        $stderr = (string) file_get_contents("{$this->log}.stderr");
        $this->assertSame(1, substr_count($stderr, 'its handler ran past the 0.5 s timeout and was killed'), $stderr);
        $this->assertStringNotContainsString('killed by signal', $stderr, 'not reported as a death of unknown cause');
        $hung = array_values(array_filter($this->handled(), fn ($h) => $h[0] === 3));
        $this->assertCount(1, $hung);
        $this->assertSame(2, $hung[0][1], 'handled on its second attempt');
        $this->assertEveryMessageHandled(50, 10);
    }

    public function testExitInAHandlerStopsThePoolAndReturnsTheMessage(): void
    {
        $this->fill(5, [0 => ['exit' => true]]);
        $proc = $this->startWorker(['threads' => 1]);
        $this->assertSame(3, proc_close($proc), 'exit(3) reaches the script');
        $stats = $this->q->stats();
        $this->assertSame(0, $stats['inflight'], 'nothing left waiting for a lease');
        $this->assertSame(5, $stats['ready']);
        $exited = array_values(array_filter(array_map(fn ($id) => $this->q->get($id),
            $this->redis->zRange('{dq:jobs}:scheduled', 0, -1)), fn ($m) => $m['payload']['exit'] ?? false))[0];
        $this->assertSame(1, $exited['attempts'], 'counted: a handler that always exits ends in the dead letters');
        $this->assertStringContainsString('exit()', $exited['last_error']);
    }

    /** Issue 28 (a): with processes as with one, exit() stops the pool and the attempt counts. */
    public function testExitInAHandlerUnderProcessesStopsThePoolAndEndsInTheDeadLetters(): void
    {
        $exiting = $this->q->push(['n' => 0, 'exit' => true]);
        foreach ([1, 2, 3, 4] as $n) {
            $this->q->push(['n' => $n]);
        }
        $options = ['processes' => 2, 'max_attempts' => 2, 'stop_when_empty' => true, 'lease' => 60.0];
        // Each run ends by the exit; the other process may take the message too before
        // it is told to stop (then it exits as well, and that counts too).
        $runs = 0;
        do {
            $runs++;
            $proc = $this->startWorker($options);
            $this->assertSame(0, $this->waitForExit($proc, "the pool stopped by exit() (run $runs)"),
                'run() returned to the script');
            $summary = $this->summary();
            $this->assertSame('exit', $summary['stopped_by'], "run $runs");
            $this->assertSame(0, $summary['restarts'], 'the exited process was not replaced');
            $this->assertGreaterThanOrEqual(1, $summary['failed'], 'the exit counts as a failure');
            $info = $this->q->get($exiting);
            $this->assertContains($info['state'], ['ready', 'dead'], 'due again at once, not after the lease');
            if ($info['state'] === 'ready') {
                $this->assertSame(1, $info['attempts']);
            }
            $this->assertStringContainsString('exit()', $info['last_error']);
        } while ($info['state'] !== 'dead' && $runs < 3);
        $this->assertSame(['dead', 2], [$info['state'], $info['attempts']], 'in the dead letters after max_attempts');
        $this->assertStringContainsString('gave up after 2 attempts', $this->q->get($exiting)['last_error']);
        $proc = $this->startWorker($options);
        $this->assertSame(0, $this->waitForExit($proc, 'the rest handled'));
        $this->assertSame('empty', $this->summary()['stopped_by']);
        $this->assertEqualsCanonicalizing([1, 2, 3, 4], array_column($this->handled(), 0));
        $this->assertEquals(['dead' => 1, 'ready' => 0, 'inflight' => 0],
            array_intersect_key($this->q->stats(), array_flip(['dead', 'ready', 'inflight'])));
    }

    /** Issue 28 (1): processes that die at their start are started again after a back-off, then given up on. */
    public function testAPoolWhoseProcessesKeepDyingAtTheirStartGivesUp(): void
    {
        $id = $this->q->push(['n' => 1]);
        $w = new DelayQueueWorker($this->q, [
            'processes' => 2,
            // Each process dies before it consumes: as a broken bootstrap would.
            'on_start' => function () { posix_kill(getmypid(), SIGKILL); },
        ]);
        try {
            $w->run(function () { throw new LogicException('no process lived to run this'); });
            $this->fail('run() returned');
        } catch (DelayQueueException $e) {
            $this->assertStringContainsString(
                'worker processes in a row ended within 2 s of their start; giving up', $e->getMessage());
        }
        $this->assertSame('ready', $this->q->get($id)['state'], 'the message waits for a pool that lives');
        $this->assertSame(0, $this->q->get($id)['attempts']);
    }

    /**
     * Issue 51 (3): a handler that kills its own process fails its message, counted as an
     * attempt, and is not counted toward giving up: the pool goes on, the poison messages end
     * in the dead letters after max_attempts.
     */
    public function testHandlersThatKillTheirOwnProcessFailTheirMessagesAndThePoolGoesOn(): void
    {
        $items = [];
        for ($n = 0; $n < 100; $n++) {
            $items[] = ['payload' => ['n' => $n, 'kill' => $n % 20 === 7]];
        }
        $ids = $this->q->pushMany($items);
        // The supervisor fails what a dead process ran, counted; what its claims held besides
        // comes back uncharged when their lease ends (quarantined, see claim.lua).
        $proc = $this->startWorker(['processes' => 2, 'max_attempts' => 3, 'lease' => 1.0]);
        $exit = null;
        delayq_wait_for(90, 'the others acked and the poison dead, or the pool gone', function () use ($proc, &$exit) {
            $status = proc_get_status($proc);
            if (!$status['running']) {
                $exit = $status['exitcode'];
                return true;
            }
            return $this->drained() && $this->q->stats()['dead'] === 5;
        });
        $stderr = (string) file_get_contents("{$this->log}.stderr");
        $this->assertNull($exit, "the pool ended by itself (exit $exit):\n$stderr");
        proc_terminate($proc, SIGTERM);
        $this->assertSame(0, proc_close($proc));
        $summary = $this->summary();
        $this->assertSame('signal', $summary['stopped_by']);
        $this->assertSame(15, $summary['restarts'], 'each kill replaced, 3 for each poison message');
        foreach ($ids as $n => $id) {
            if ($n % 20 === 7) {
                $info = $this->q->get($id);
                $this->assertSame(['dead', 3], [$info['state'], $info['attempts']], "poison message $n");
                $this->assertStringContainsString('was killed by signal 9', $info['last_error']);
                $this->assertStringContainsString('gave up after 3 attempts', $info['last_error']);
            } else {
                $this->assertNull($this->q->get($id), "message $n acked");
            }
        }
        $this->assertSame(5, $this->q->stats()['dead']);
        $this->assertEqualsCanonicalizing(array_values(array_diff(range(0, 99), [7, 27, 47, 67, 87])),
            array_values(array_unique(array_column($this->handled(), 0))));
        $stderr = (string) file_get_contents("{$this->log}.stderr");
        $this->assertStringNotContainsString('giving up', $stderr);
        $this->assertStringNotContainsString('the next starts in', $stderr, 'replaced at once, no back-off');
    }

    /** Issue 28 (d): a handler killed at its timeout fails its message at once, counted. */
    public function testAHandlerKilledAtItsTimeoutFailsItsMessageAtOnceAndKeepsTheCounts(): void
    {
        // Hangs on every attempt: killed twice, then dead; hangs once: acked on its second.
        $always = $this->q->push(['n' => 0, 'hang' => true, 'hang_attempts' => 99]);
        $once = $this->q->push(['n' => 1, 'hang' => true]);
        foreach ([2, 3, 4] as $n) {
            $this->q->push(['n' => $n]);
        }
        // A lease far past waitForExit's patience: what comes back in time was failed
        // by the supervisor, not left to expire. stop_when_empty must wait for it.
        $proc = $this->startWorker(['processes' => 2, 'timeout' => 1.0, 'lease' => 60.0, 'max_attempts' => 2,
            'stop_when_empty' => true, 'backoff_base' => 30.0]);
        $this->assertSame(0, $this->waitForExit($proc, 'the pool to end by itself'));
        $summary = $this->summary();
        $this->assertSame('empty', $summary['stopped_by']);
        $this->assertSame(3, $summary['killed_hung']);
        $this->assertSame(
            ['handled' => 7, 'acked' => 4, 'failed' => 3, 'retried' => 2, 'dead' => 1],
            array_intersect_key($summary, array_flip(['handled', 'acked', 'failed', 'retried', 'dead'])),
            'the killed processes\' counts are in the summary');
        $info = $this->q->get($always);
        $this->assertSame(['dead', 2], [$info['state'], $info['attempts']]);
        $this->assertSame('handler exceeded its 1 s timeout; process killed (gave up after 2 attempts)',
            $info['last_error']);
        $this->assertNull($this->q->get($once), 'acked');
        $this->assertSame([[1, 2]], array_values(array_map(fn ($h) => [$h[0], $h[1]],
            array_filter($this->handled(), fn ($h) => $h[0] === 1))), 'ran again at once, on its second attempt');
        $this->assertEqualsCanonicalizing([1, 2, 3, 4], array_column($this->handled(), 0));
        $stderr = (string) file_get_contents("{$this->log}.stderr");
        $this->assertSame(3, substr_count($stderr, 'its handler ran past the 1 s timeout and was killed'), $stderr);
    }

    /** Issue 28 (d): the error names the timeout, and get() counts the attempts it says. */
    public function testTheTimeoutErrorAndTheAttemptsAgree(): void
    {
        $id = $this->q->push(['n' => 0, 'hang' => true]);
        $proc = $this->startWorker(['processes' => 2, 'timeout' => 2.0, 'lease' => 60.0, 'max_attempts' => 1,
            'stop_when_empty' => true]);
        $this->assertSame(0, $this->waitForExit($proc, 'the pool to end by itself'));
        $info = $this->q->get($id);
        $this->assertSame(['dead', 1, 'handler exceeded its 2 s timeout; process killed'],
            [$info['state'], $info['attempts'], $info['last_error']]);
        $summary = $this->summary();
        $this->assertSame(['empty', 1, 1, 1, 1], [$summary['stopped_by'], $summary['killed_hung'], $summary['handled'],
            $summary['failed'], $summary['dead']]);
        $this->assertSame([], $this->handled());
    }

    /** @return array<string, array{0: array}> */
    public static function forkingWorkerOptions(): array
    {
        return ['one process' => [[]], 'supervised processes' => [['processes' => 2, 'timeout' => 30]]];
    }

    /**
     * A handler that forks (side work in a child) leaves no hung child: returning from the
     * handler, exit() or an uncaught exception ends the child there, before it touches
     * the pool it inherited, and only the parent acknowledges the message.
     *
     * @dataProvider forkingWorkerOptions
     */
    #[PHPUnit\Framework\Attributes\DataProvider('forkingWorkerOptions')]
    public function testAChildForkedByAHandlerEndsWhenItReturnsOrExitsAndTheParentGoesOn(array $options): void
    {
        $this->assertTrue(function_exists('pcntl_fork'), 'the test needs pcntl');
        $this->q->pushMany([
            ['payload' => ['n' => 0, 'child' => 'return']],
            ['payload' => ['n' => 1, 'child' => 'exit']],
            ['payload' => ['n' => 2]],
            ['payload' => ['n' => 3, 'child' => 'throw']],
            ['payload' => ['n' => 4, 'child' => 'return']],
            ['payload' => ['n' => 5]],
        ]);
        $cmd = array_merge(delayq_php_command(), [__DIR__ . '/forking_handler.php', $GLOBALS['DELAYQ_REDIS']->url(),
            'jobs', $this->log, json_encode((object) $options)]);
        $proc = proc_open($cmd, [0 => ['file', '/dev/null', 'r'], 1 => ['file', '/dev/null', 'w'],
            2 => ['file', "{$this->log}.stderr", 'w']], $pipes);
        $this->assertIsResource($proc);
        $stderr = fn () => (string) @file_get_contents("{$this->log}.stderr");
        $this->assertSame(0, $this->waitForExit($proc, 'the forking worker to drain the queue'), $stderr());

        $lines = file($this->log, FILE_IGNORE_NEW_LINES | FILE_SKIP_EMPTY_LINES);
        $ended = [];
        foreach ($lines as $line) {
            [$n, , $how] = explode(' ', $line, 3);
            $this->assertArrayNotHasKey((int) $n, $ended, "message $n ran once");
            $ended[(int) $n] = $how;
        }
        ksort($ended);
        $this->assertSame([0 => 'exit 0', 1 => 'exit 7', 2 => 'plain', 3 => 'exit 255', 4 => 'exit 0', 5 => 'plain'],
            $ended, 'each child ended by itself, with the status PHP gives its ending: ' . $stderr());
        $this->assertSame(1, substr_count($stderr(), 'a process forked by a handler ended with an uncaught '
            . 'DomainException: the side work of 3 failed'), $stderr());
        $summary = $this->summary();
        $expected = ['handled' => 6, 'acked' => 6, 'failed' => 0, 'lease_lost' => 0, 'gone' => 0,
            'released' => 0, 'unwritten' => 0, 'stopped_by' => 'empty'];
        $this->assertSame($expected, array_intersect_key($summary, $expected));
        $stats = $this->q->stats();
        $this->assertSame([6, 6, 0, 0], [$stats['delivered'], $stats['acked'], $stats['released'] ?? 0,
            $stats['inflight']], 'acknowledged once each, by the parent');
        $side = (new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'side'))->stats();
        $this->assertSame(4, $side['ready'], 'each child did its side work with a queue of its own');
        $this->assertStringNotContainsString('panic', $stderr());
        $this->assertFileDoesNotExist("{$this->log}.shutdown-ran", 'a child runs no shutdown function');
    }

    /**
     * The supervisor reaps only the processes it started: a child the application forked
     * itself stays for the application's own pcntl_waitpid(), with its exit status.
     */
    public function testTheSupervisorLeavesTheApplicationsOwnChildrenAlone(): void
    {
        $this->assertTrue(function_exists('pcntl_fork'), 'the test needs pcntl');
        $this->q->pushMany([['payload' => ['n' => 0]], ['payload' => ['n' => 1]]]);
        $cmd = array_merge(delayq_php_command(), [__DIR__ . '/own_child.php', $GLOBALS['DELAYQ_REDIS']->url(), 'jobs']);
        $proc = proc_open($cmd, [0 => ['file', '/dev/null', 'r'], 1 => ['pipe', 'w'],
            2 => ['file', "{$this->log}.stderr", 'w']], $pipes);
        $this->assertIsResource($proc);
        $out = stream_get_contents($pipes[1]);
        fclose($pipes[1]);
        $stderr = (string) @file_get_contents("{$this->log}.stderr");
        $this->assertSame(0, proc_close($proc), $stderr);
        $this->assertSame(['waited' => true, 'status' => 5, 'stopped_by' => 'empty', 'handled' => 2],
            json_decode((string) $out, true), $out . $stderr);
    }

    /**
     * The supervisor finds a hung handler by the start time its process writes in a
     * shared slot: a child that returned from the handler must not clear it, or the
     * parent's hang would go unnoticed.
     */
    public function testAChildForkedByAHandlerLeavesTheHungHandlerClockToItsParent(): void
    {
        $this->q->push(['n' => 0, 'child' => 'return', 'hang' => true]);
        $cmd = array_merge(delayq_php_command(), [__DIR__ . '/forking_handler.php', $GLOBALS['DELAYQ_REDIS']->url(),
            'jobs', $this->log, json_encode(['timeout' => 0.5, 'lease' => 2, 'stop_when_empty' => false])]);
        $proc = proc_open($cmd, [0 => ['file', '/dev/null', 'r'], 1 => ['file', '/dev/null', 'w'],
            2 => ['file', "{$this->log}.stderr", 'w']], $pipes);
        $this->assertIsResource($proc);
        $lines = fn () => @file($this->log, FILE_IGNORE_NEW_LINES | FILE_SKIP_EMPTY_LINES) ?: [];
        try {
            delayq_wait_for(20, 'the message to run again after its hung handler was killed',
                fn () => count($lines()) === 2 && $this->drained());
        } catch (RuntimeException $e) {
            // Its handler process sleeps for an hour: end the pool, not just the test.
            $supervisor = proc_get_status($proc)['pid'];
            foreach (glob('/proc/[0-9]*/stat') ?: [] as $stat) {
                $fields = explode(' ', substr((string) strrchr((string) @file_get_contents($stat), ')'), 2));
                if ((int) ($fields[1] ?? 0) === $supervisor) {
                    posix_kill((int) basename(dirname($stat)), SIGKILL);
                }
            }
            proc_terminate($proc, SIGKILL);
            proc_close($proc);
            throw $e;
        }
        proc_terminate($proc, SIGTERM);
        $stderr = (string) file_get_contents("{$this->log}.stderr");
        $this->assertSame(0, $this->waitForExit($proc, 'the pool to stop'), $stderr);
        $this->assertSame(['exit 0', 'exit 0'], array_map(fn ($l) => explode(' ', $l, 3)[2], $lines()),
            'each child ended by itself');
        $summary = $this->summary();
        $this->assertSame([1, 1], [$summary['killed_hung'], $summary['acked']], json_encode($summary));
    }

    public function testAHandlerThatNeedsMoreThanPayloadAndMessageIsRefusedAtStart(): void
    {
        $this->q->push(['n' => 1]);
        $line = __LINE__ + 2;
        $refused = [
            'closure' => [fn ($payload, $message, $extra) => null, "{closure} at " . __FILE__ . ":$line"],
            'function name' => ['delayq_test_handler_of_three', 'delayq_test_handler_of_three'],
            'invokable object' => [new HandlerOfThree(), 'HandlerOfThree::__invoke'],
            '[object, method]' => [[new HandlerOfThree(), 'handle'], 'HandlerOfThree::handle'],
            '[class, static method]' => [[HandlerOfThree::class, 'handleStatic'], 'HandlerOfThree::handleStatic'],
        ];
        foreach ($refused as $kind => [$handler, $name]) {
            $worker = new DelayQueueWorker($this->q, ['stop_when_empty' => true]);
            try {
                $worker->run($handler);
                $this->fail("$kind: ran");
            } catch (DelayQueueInvalidArgumentException $e) {
                $this->assertSame("handler $name needs 3 arguments; a worker calls it with (\$payload, \$message)",
                    $e->getMessage(), $kind);
            }
        }
        // A built-in function refuses extra arguments, so one taking fewer than two is
        // refused too; built-ins that take two, or any number, run.
        foreach (['strlen' => 'strlen takes at most 1 argument', 'time' => 'time takes at most 0 arguments']
            as $builtin => $says) {
            try {
                (new DelayQueueWorker($this->q, ['stop_when_empty' => true]))->run($builtin);
                $this->fail("$builtin: ran");
            } catch (DelayQueueInvalidArgumentException $e) {
                $this->assertSame("handler $says; a worker calls it with (\$payload, \$message)", $e->getMessage());
            }
        }
        $stats = $this->q->stats();
        $this->assertSame([1, 0], [$stats['ready'], $stats['delivered']], 'refused before anything was claimed');
        $summary = (new DelayQueueWorker($this->q, ['stop_when_empty' => true]))->run('var_dump');
        $this->assertSame(1, $summary['acked'], 'a variadic built-in takes both arguments');
        $this->expectOutputRegex('/array\(1\)/');
        $this->q->push(['n' => 1]);

        // Fewer parameters, optional ones and variadics take what the worker passes.
        $seen = [];
        foreach ([function ($payload) use (&$seen) { $seen[] = $payload; },
            function ($payload, $message = null, $extra = null) use (&$seen) { $seen[] = $payload; },
            function (...$arguments) use (&$seen) { $seen[] = $arguments[0]; }] as $n => $handler) {
            if ($n > 0) {
                $this->q->push(['n' => 1]);
            }
            $summary = (new DelayQueueWorker($this->q, ['stop_when_empty' => true]))->run($handler);
            $this->assertSame(1, $summary['acked']);
        }
        $this->assertSame([['n' => 1], ['n' => 1], ['n' => 1]], $seen);
    }

    public function testKeepCompletedShowsWhatRanWhenAndInHowManyAttempts(): void
    {
        $q = new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'kept', ['keep_completed' => 2, 'keep_completed_for' => 3600]);
        $ids = [];
        foreach (range(0, 2) as $n) {
            $ids[] = $q->push(['n' => $n], 0, ['id' => "order-$n"]);
        }
        $failed = false;
        $done = 0;
        // One claiming thread: two would each claim one message (the prefetch of one
        // handler), and hand them out, and complete them, in either order (a CI run saw it).
        $w = new DelayQueueWorker($q, ['threads' => 1, 'backoff_base' => 0.01, 'backoff_max' => 0.01]);
        $w->run(function (array $payload) use (&$failed, &$done, $w) {
            if ($payload['n'] === 2 && !$failed) {
                $failed = true;
                throw new RuntimeException('gateway down');
            }
            if (++$done === 3) {
                $w->stop();
            }
        });

        $this->assertNull($q->get($ids[0]), 'past keep_completed => 2');
        $last = $q->get($ids[2]);
        $this->assertSame(['completed', 2, ['n' => 2], null], [$last['state'], $last['attempts'], $last['payload'], $last['last_error']]);
        $this->assertGreaterThanOrEqual($last['due_at'], $last['completed_at']);
        $this->assertSame([$ids[2], $ids[1]], array_column($q->completed(), 'id'), 'latest first');
        $this->assertSame([2, 3], [$q->stats()['completed'], $q->stats()['acked']]);
        $this->expectException(DelayQueueInvalidArgumentException::class);
        $this->expectExceptionMessage('keep_completed');
        new DelayQueue($GLOBALS['DELAYQ_REDIS']->url(), 'kept', ['keep_completed' => 1_000_001]);
    }
}

final class HandlerOfThree
{
    public function __invoke(mixed $payload, DelayQueueMessage $message, mixed $extra): void
    {
    }

    public function handle(mixed $payload, DelayQueueMessage $message, mixed $extra): void
    {
    }

    public static function handleStatic(mixed $payload, DelayQueueMessage $message, mixed $extra): void
    {
    }
}

function delayq_test_handler_of_three(mixed $payload, DelayQueueMessage $message, mixed $extra): void
{
}

/** A handler in each of PHP's callable forms, recording what it was given. */
final class RecordingHandler
{
    public static ?RecordingHandler $current = null;
    /** @var list<string> "payload-n attempt" */
    public array $got = [];
    public bool $throw = false;

    public function record(mixed $payload, DelayQueueMessage $message): void
    {
        if ($this->throw) {
            throw new RuntimeException('refused');
        }
        $this->got[] = $payload['n'] . ' ' . $message->attempt;
    }

    public function __invoke(mixed $payload, DelayQueueMessage $message): void
    {
        $this->record($payload, $message);
    }

    public function handle(mixed $payload, DelayQueueMessage $message): void
    {
        $this->record($payload, $message);
    }

    public static function handleStatic(mixed $payload, DelayQueueMessage $message): void
    {
        self::$current->record($payload, $message);
    }

    /** @param array{0: mixed, 1: DelayQueueMessage} $args */
    public function __call(string $name, array $args): void
    {
        $this->record(...$args);
    }
}

function delayq_test_recording_handler(mixed $payload, DelayQueueMessage $message): void
{
    RecordingHandler::$current->record($payload, $message);
}
