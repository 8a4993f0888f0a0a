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

    /** @param float $idleSleep see DelayqQueue::setIdleSleep */
    public function __construct(private float $idleSleep = 0.0)
    {
    }

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
        $url = $config['url'] ?? null;
        if (!is_string($url) || $url === '') {
            // A default address could reach another Redis than the one meant.
            throw new InvalidArgumentException("delayq queue connection: 'url' is not set (a Redis URL such as redis://127.0.0.1:6379, e.g. from env('DELAYQ_URL'))");
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
        $queue = new DelayqQueue(
            $url,
            (string) ($config['queue'] ?? 'default'),
            $options,
            (float) $retryAfter,
            (float) $blockFor,
            (bool) ($config['after_commit'] ?? false),
        );
        $queue->setIdleSleep($this->idleSleep);
        return $queue;
    }
}
