<?php

declare(strict_types=1);

namespace Delayq;

/**
 * Blocks SIGTERM and SIGINT while a claimed message runs, and lets them through after.
 *
 * While run() blocks, the extension replaces PHP's handlers for these signals with its
 * own, which stops the pool; a signal that comes as a one-message pool ends for another
 * reason (its one job done, its wait over) is dropped, and the framework's worker would
 * never hear of it. Blocked instead, the signal waits and reaches the framework's own
 * handler once run() has returned: the running job finishes, then the worker stops,
 * as queue:work and messenger:consume do without delayq.
 */
final class StopSignals
{
    private bool $held;

    /** @param list<int> $previous */
    private function __construct(private array $previous, bool $held)
    {
        $this->held = $held;
    }

    public static function hold(): self
    {
        if (!function_exists('pcntl_sigprocmask')) {
            return new self([], false);
        }
        $previous = [];
        pcntl_sigprocmask(SIG_BLOCK, [SIGTERM, SIGINT], $previous);
        return new self($previous, true);
    }

    public function release(): void
    {
        if ($this->held) {
            $this->held = false;
            pcntl_sigprocmask(SIG_SETMASK, $this->previous);
        }
    }

    public function __destruct()
    {
        $this->release();
    }
}
