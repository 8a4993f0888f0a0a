<?php

declare(strict_types=1);

namespace Delayq\Symfony;

use Delayq\Receiver;
use DelayQueue;
use DelayQueueException;
use DelayQueueMessage;
use Symfony\Component\Messenger\Envelope;
use Symfony\Component\Messenger\Exception\LogicException;
use Symfony\Component\Messenger\Exception\MessageDecodingFailedException;
use Symfony\Component\Messenger\Exception\TransportException;
use Symfony\Component\Messenger\Stamp\DelayStamp;
use Symfony\Component\Messenger\Stamp\ErrorDetailsStamp;
use Symfony\Component\Messenger\Stamp\TransportMessageIdStamp;
use Symfony\Component\Messenger\Transport\Receiver\ListableReceiverInterface;
use Symfony\Component\Messenger\Transport\Receiver\MessageCountAwareInterface;
use Symfony\Component\Messenger\Transport\Serialization\SerializerInterface;
use Symfony\Component\Messenger\Transport\TransportInterface;

/**
 * A Messenger transport on one delayq queue. send() pushes the serializer's body and
 * headers, due after the DelayStamp's delay on the Redis server's clock; get() takes
 * the next due message from a consumer that lives as long as the process (see
 * Receiver), ack() acknowledges it, reject() deletes it (retry "messenger") or fails
 * it into delayq's retries and dead letters (retry "delayq"). Each decision is
 * written before the call returns.
 */
final class DelayqTransport implements TransportInterface, MessageCountAwareInterface, ListableReceiverInterface
{
    /** @var array<string, DelayQueueMessage> the deliveries this process holds, by message id */
    private array $held = [];

    public function __construct(
        private DelayQueue $queue,
        private Receiver $receiver,
        private SerializerInterface $serializer,
        private string $retry = 'messenger',
    ) {
    }

    public function send(Envelope $envelope): Envelope
    {
        $encoded = $this->serializer->encode($envelope);
        $delayMs = $envelope->last(DelayStamp::class)?->getDelay() ?? 0;
        try {
            $id = $this->queue->push(self::payload($encoded), max(0, $delayMs) / 1000);
        } catch (DelayQueueException $e) {
            throw new TransportException($e->getMessage(), 0, $e);
        }
        return $envelope->with(new TransportMessageIdStamp($id));
    }

    public function get(): iterable
    {
        try {
            $message = $this->receiver->receive();
        } catch (DelayQueueException $e) {
            throw new TransportException($e->getMessage(), 0, $e);
        }
        if ($message === null) {
            return [];
        }
        try {
            $envelope = $this->decode($message->payload);
        } catch (MessageDecodingFailedException $e) {
            // No consumer will decode it better: keep it where an operator can see it.
            $message->deadLetter('cannot decode the Messenger envelope: ' . $e->getMessage());
            throw $e;
        }
        $id = $message->id;
        $this->held[$id] = $message;
        return [$envelope->with(new DelayqReceivedStamp($id), new TransportMessageIdStamp($id))];
    }

    public function ack(Envelope $envelope): void
    {
        $message = $this->take($envelope);
        if ($message === null) {
            // Not a delivery of this process (messenger:failed:retry on a listed message).
            $this->queue->cancel($this->idOf($envelope));
            return;
        }
        try {
            $message->ack();
        } catch (DelayQueueException $e) {
            throw new TransportException($e->getMessage(), 0, $e);
        }
    }

    public function reject(Envelope $envelope): void
    {
        $message = $this->take($envelope);
        try {
            $this->decide($envelope, $message);
        } catch (DelayQueueException $e) {
            throw new TransportException($e->getMessage(), 0, $e);
        }
    }

    private function decide(Envelope $envelope, ?DelayQueueMessage $message): void
    {
        if ($message === null) {
            $this->queue->cancel($this->idOf($envelope));
        } elseif ($this->retry === 'delayq') {
            // AddErrorDetailsStampListener (registered by FrameworkBundle) says why.
            $error = $envelope->last(ErrorDetailsStamp::class);
            $message->fail($error === null ? 'rejected by Messenger'
                : $error->getExceptionClass() . ': ' . $error->getExceptionMessage());
        } else {
            // Messenger has re-sent it for a retry, or to the failure transport, or given up.
            $message->ack();
        }
    }

    public function getMessageCount(): int
    {
        $stats = $this->queue->stats();
        return $stats['scheduled'] + $stats['ready'];
    }

    public function all(?int $limit = null): iterable
    {
        foreach ($this->queue->waiting(min($limit ?? 1000, 1000)) as $message) {
            yield $this->decode($message['payload'])->with(new TransportMessageIdStamp($message['id']));
        }
    }

    public function find($id): ?Envelope
    {
        $message = $this->queue->get((string) $id);
        if ($message === null || !in_array($message['state'], ['scheduled', 'ready'], true)) {
            return null;
        }
        return $this->decode($message['payload'])->with(new TransportMessageIdStamp($message['id']));
    }

    public function getDelayQueue(): DelayQueue
    {
        return $this->queue;
    }

    /** @param array{body: string, headers?: array<string, mixed>} $encoded */
    private static function payload(array $encoded): array
    {
        $body = $encoded['body'];
        // delayq stores JSON, which holds only UTF-8 text; PhpSerializer's bodies may hold other bytes.
        $payload = mb_check_encoding($body, 'UTF-8') ? ['body' => $body] : ['body_base64' => base64_encode($body)];
        return $payload + ['headers' => $encoded['headers'] ?? []];
    }

    private function decode(mixed $payload): Envelope
    {
        if (!is_array($payload) || !(isset($payload['body']) || isset($payload['body_base64']))) {
            throw new MessageDecodingFailedException('the delayq message is no Messenger envelope (no body)');
        }
        $body = $payload['body'] ?? base64_decode((string) $payload['body_base64'], true);
        return $this->serializer->decode(['body' => $body, 'headers' => $payload['headers'] ?? []]);
    }

    private function take(Envelope $envelope): ?DelayQueueMessage
    {
        $id = $envelope->last(DelayqReceivedStamp::class)?->id;
        if ($id === null || !isset($this->held[$id])) {
            return null;
        }
        $message = $this->held[$id];
        unset($this->held[$id]);
        return $message;
    }

    private function idOf(Envelope $envelope): string
    {
        $id = $envelope->last(TransportMessageIdStamp::class)?->getId();
        if ($id === null) {
            throw new LogicException('no delayq message id on this envelope (no TransportMessageIdStamp)');
        }
        return (string) $id;
    }
}
