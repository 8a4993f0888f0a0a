<?php

declare(strict_types=1);

namespace Delayq\Tests;

use RuntimeException;

/** Polls $cond until it holds; fails the test after $seconds (a bound on a hang, not a speed check). */
function wait_for(float $seconds, string $what, callable $cond): void
{
    $deadline = microtime(true) + $seconds;
    while (!$cond()) {
        if (microtime(true) > $deadline) {
            throw new RuntimeException("timed out after {$seconds} s waiting for $what");
        }
        usleep(20000);
    }
}

/**
 * The php binary for child processes, with the extension that scripts/test.sh built
 * when it is not installed system-wide (DELAYQ_EXTENSION, as for php-ext's tests).
 *
 * @return list<string>
 */
function php_command(): array
{
    $ext = getenv('DELAYQ_EXTENSION');
    return $ext ? [PHP_BINARY, '-d', "extension=$ext"] : [PHP_BINARY];
}
