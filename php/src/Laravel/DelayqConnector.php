<?php

declare(strict_types=1);

namespace Delayq\Laravel;

use Illuminate\Queue\Connectors\ConnectorInterface;
use InvalidArgumentException;

/**
 * Builds a DelayqQueue from a connection of config/queue.php:
 *   'delayq' => ['driver' => 'delayq', 'url' => env('DELAYQ_URL'), 'queue' => 'default',
 *                'retry_after' => 90, 'block_for' => 1, 'after_commit' => false, 'options' => ['prefix' => 'dq']]
 */
class DelayqConnector implements ConnectorInterface
{
    public const KEYS = ['driver', 'url', 'queue', 'retry_after', 'block_for', 'after_commit', 'options'];

    public function connect(array $config)
    {
        if (!extension_loaded('delayq')) {
            throw new \RuntimeException('the delayq queue driver needs the delayq PHP extension, which is not loaded');
        }
        $unknown = array_diff(array_keys($config), self::KEYS);
        if ($unknown !== []) {
            throw new InvalidArgumentException(sprintf(
                "delayq queue connection: unknown option '%s' (known: %s)",
                implode("', '", $unknown),
                implode(', ', self::KEYS),
            ));
        }
        $options = $config['options'] ?? [];
        if (!is_array($options)) {
            throw new InvalidArgumentException("delayq queue connection: 'options' must be an array of DelayQueue options");
        }
        $retryAfter = $config['retry_after'] ?? 90;
        if (!is_numeric($retryAfter) || $retryAfter <= 0) {
            throw new InvalidArgumentException("delayq queue connection: 'retry_after' must be a number of seconds above 0");
        }
        $blockFor = $config['block_for'] ?? 1.0;
        if (!is_numeric($blockFor) || $blockFor < 0) {
            throw new InvalidArgumentException("delayq queue connection: 'block_for' must be a number of seconds, 0 or more");
        }
        return new DelayqQueue(
            (string) ($config['url'] ?? 'redis://127.0.0.1:6379'),
            (string) ($config['queue'] ?? 'default'),
            $options,
            (float) $retryAfter,
            (float) $blockFor,
            (bool) ($config['after_commit'] ?? false),
        );
    }
}
