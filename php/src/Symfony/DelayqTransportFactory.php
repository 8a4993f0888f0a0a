<?php

declare(strict_types=1);

namespace Delayq\Symfony;

use Delayq\Receiver;
use DelayQueue;
use DelayQueueException;
use Symfony\Component\Messenger\Exception\InvalidArgumentException;
use Symfony\Component\Messenger\Transport\Serialization\SerializerInterface;
use Symfony\Component\Messenger\Transport\TransportFactoryInterface;
use Symfony\Component\Messenger\Transport\TransportInterface;

/**
 * delayq://[user:password@]host[:port][/queue][?option=value...] (delayqs:// for TLS).
 *
 * Options, in the query or the transport's `options`: `queue` (default "messages"),
 * `db`, `lease` (seconds a dead consumer's message waits before it runs again, 60),
 * `wait` (seconds get() waits for a due message, 1), `retry`: "messenger" (default:
 * Messenger's retry strategy and failure transport decide, and reject() deletes the
 * delivery) or "delayq" (reject() fails the delivery: delayq's backoff, `max_attempts`,
 * `backoff_base`, `backoff_max` and dead letters; set Messenger's `max_retries` to 0 and no
 * failure transport). Any other option is a DelayQueue option (`prefix`, `partitions`, ...).
 */
final class DelayqTransportFactory implements TransportFactoryInterface
{
    private const TRANSPORT_OPTIONS = ['queue', 'db', 'lease', 'wait', 'retry', 'max_attempts', 'backoff_base',
        'backoff_max', 'transport_name'];

    public function createTransport(string $dsn, array $options, SerializerInterface $serializer): TransportInterface
    {
        if (!extension_loaded('delayq')) {
            throw new InvalidArgumentException('the delayq Messenger transport needs the delayq PHP extension, which is not loaded');
        }
        $parts = parse_url($dsn);
        if ($parts === false || !isset($parts['scheme'], $parts['host']) || !$this->supports($dsn, $options)) {
            throw new InvalidArgumentException(sprintf('the delayq transport DSN "%s" is invalid: expected delayq://host:port/queue', $this->redact($dsn)));
        }
        $query = [];
        parse_str($parts['query'] ?? '', $query);
        $options = array_map(self::typed(...), $query) + $options;
        unset($options['transport_name']);

        $path = trim($parts['path'] ?? '', '/');
        $queue = (string) ($options['queue'] ?? ($path !== '' ? rawurldecode($path) : 'messages'));
        $retry = $options['retry'] ?? 'messenger';
        if (!in_array($retry, ['messenger', 'delayq'], true)) {
            throw new InvalidArgumentException(sprintf('delayq transport option "retry" must be "messenger" or "delayq", "%s" given', $retry));
        }
        $lease = self::seconds($options, 'lease', 60.0, false);
        $wait = self::seconds($options, 'wait', 1.0, true);
        $worker = ['lease' => $lease];
        foreach (['max_attempts', 'backoff_base', 'backoff_max'] as $key) {
            if (isset($options[$key])) {
                $worker[$key] = $options[$key];
            }
        }
        if ($retry === 'messenger') {
            if (isset($options['max_attempts'])) {
                throw new InvalidArgumentException('delayq transport option "max_attempts" needs retry=delayq (with retry=messenger, set Messenger\'s max_retries)');
            }
            // Messenger counts retries and re-sends: delayq's own limit must never come first.
            $worker['max_attempts'] = 4294967295;
        }

        $url = ($parts['scheme'] === 'delayqs' ? 'rediss' : 'redis') . '://';
        if (isset($parts['user']) || isset($parts['pass'])) {
            $url .= ($parts['user'] ?? '') . (isset($parts['pass']) ? ':' . $parts['pass'] : '') . '@';
        }
        $url .= $parts['host'] . ':' . ($parts['port'] ?? 6379);
        if (isset($options['db'])) {
            $url .= '/' . $options['db'];
        }
        $queueOptions = array_diff_key($options, array_flip(self::TRANSPORT_OPTIONS));
        try {
            $delayQueue = new DelayQueue($url, $queue, $queueOptions);
            // messenger:consume sleeps 1 s (its --sleep) after an empty get().
            $receiver = new Receiver($delayQueue, $worker, $wait, 1.0);
        } catch (DelayQueueException $e) {
            $message = $e->getMessage();
            if (str_contains($message, 'unknown')) {
                $message .= '; the transport\'s own options: ' . implode(', ', array_diff(self::TRANSPORT_OPTIONS, ['transport_name']));
            }
            throw new InvalidArgumentException(sprintf('delayq transport "%s": %s', $this->redact($dsn), $message), 0, $e);
        }
        return new DelayqTransport($delayQueue, $receiver, $serializer, $retry);
    }

    public function supports(string $dsn, array $options): bool
    {
        return str_starts_with($dsn, 'delayq://') || str_starts_with($dsn, 'delayqs://');
    }

    /** Query values are strings; DelayQueue wants ints, floats and booleans. */
    private static function typed(mixed $value): mixed
    {
        if (!is_string($value)) {
            return $value;
        }
        if (preg_match('/^-?\d+$/', $value)) {
            return (int) $value;
        }
        if (is_numeric($value)) {
            return (float) $value;
        }
        return match (strtolower($value)) {
            'true' => true,
            'false' => false,
            default => $value,
        };
    }

    /** A number of seconds, above 0 (or 0 too with $zero), from a DSN or option value. */
    private static function seconds(array $options, string $name, float $default, bool $zero): float
    {
        $value = $options[$name] ?? $default;
        if (!is_int($value) && !is_float($value) || ($zero ? $value < 0 : $value <= 0)) {
            throw new InvalidArgumentException(sprintf('delayq transport option "%s" must be a number of seconds %s, "%s" given',
                $name, $zero ? '(0 or more)' : 'above 0', is_scalar($value) ? (string) $value : get_debug_type($value)));
        }
        return (float) $value;
    }

    /** The DSN without what comes before its last "@" (user and password, which may hold "/" or "@"). */
    private function redact(string $dsn): string
    {
        $at = strrpos($dsn, '@');
        $scheme = strpos($dsn, '//');
        if ($at === false || $scheme === false || $at < $scheme) {
            return $dsn;
        }
        return substr($dsn, 0, $scheme + 2) . '****' . substr($dsn, $at);
    }
}
