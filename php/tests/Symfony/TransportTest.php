<?php

declare(strict_types=1);

namespace Delayq\Tests\Symfony;

use DelayQueue;
use Delayq\Symfony\DelayqTransportFactory;
use Delayq\Tests\RedisServer;
use PHPUnit\Framework\TestCase;
use RuntimeException;
use Symfony\Component\Console\Application;
use Symfony\Component\Console\Input\ArrayInput;
use Symfony\Component\Console\Output\BufferedOutput;
use Symfony\Component\EventDispatcher\EventDispatcher;
use Symfony\Component\Messenger\Command\ConsumeMessagesCommand;
use Symfony\Component\Messenger\Envelope;
use Symfony\Component\Messenger\Event\WorkerMessageHandledEvent;
use Symfony\Component\Messenger\Event\WorkerMessageFailedEvent;
use Symfony\Component\Messenger\EventListener\AddErrorDetailsStampListener;
use Symfony\Component\Messenger\EventListener\SendFailedMessageForRetryListener;
use Symfony\Component\Messenger\EventListener\SendFailedMessageToFailureTransportListener;
use Symfony\Component\Messenger\Exception\InvalidArgumentException;
use Symfony\Component\Messenger\Handler\HandlersLocator;
use Symfony\Component\Messenger\MessageBus;
use Symfony\Component\Messenger\Middleware\HandleMessageMiddleware;
use Symfony\Component\Messenger\Middleware\SendMessageMiddleware;
use Symfony\Component\Messenger\Retry\MultiplierRetryStrategy;
use Symfony\Component\Messenger\RoutableMessageBus;
use Symfony\Component\Messenger\Stamp\DelayStamp;
use Symfony\Component\Messenger\Stamp\ErrorDetailsStamp;
use Symfony\Component\Messenger\Stamp\RedeliveryStamp;
use Symfony\Component\Messenger\Stamp\SentToFailureTransportStamp;
use Symfony\Component\Messenger\Transport\Sender\SendersLocator;
use Symfony\Component\Messenger\Transport\Serialization\PhpSerializer;
use Symfony\Component\Messenger\Transport\TransportFactory;
use Symfony\Component\Messenger\Transport\TransportInterface;

/**
 * The delayq transport under Symfony Messenger 5.4 (Debian's php-symfony-messenger),
 * assembled as FrameworkBundle assembles it: transports from DSNs through
 * TransportFactory, a bus that routes OrderDue to the transport, and the real
 * messenger:consume command (Symfony\Component\Messenger\Worker), against a private
 * redis-server.
 */
final class TransportTest extends TestCase
{
    private RedisServer $redis;
    /** @var list<array{order: string, at: float, stamps: array<class-string, list<object>>}> */
    private array $handled = [];

    protected function setUp(): void
    {
        $this->redis = new RedisServer();
    }

    protected function tearDown(): void
    {
        $this->redis->stop();
    }

    public function testDelayedMessageIsConsumedOnceWithItsStamps(): void
    {
        $orders = $this->transport('orders');
        $bus = $this->bus(['orders' => $orders], fn (OrderDue $m) => null);
        $due = microtime(true) + 2;
        $bus->dispatch(new OrderDue('10086'), [new DelayStamp(2000), new TraceStamp('req-42')]);
        $this->assertSame(1, $this->queue('orders')->stats()['scheduled'], 'waits in delayq, not handled at dispatch');

        $dispatcher = new EventDispatcher();
        $this->consume($bus, ['orders' => $orders], $dispatcher, ['--limit' => 1]);

        $this->assertCount(1, $this->handled, 'consumed once');
        $this->assertSame('10086', $this->handled[0]['order']);
        $this->assertGreaterThanOrEqual($due - 0.01, $this->handled[0]['at'], 'not before its DelayStamp');
        $stamps = $this->handled[0]['stamps'];
        $this->assertSame('req-42', $stamps[TraceStamp::class][0]->requestId, "the application's stamp came back");
        $this->assertSame(2000, $stamps[DelayStamp::class][0]->getDelay(), 'Messenger\'s stamps came back');
        $stats = $this->queue('orders')->stats();
        $this->assertSame(1, $stats['acked']);
        $this->assertSame(0, $stats['scheduled'] + $stats['ready'] + $stats['inflight'], 'nothing left to run again');
    }

    public function testMessengerRetryStrategyAndFailureTransportKeepWorking(): void
    {
        $orders = $this->transport('orders');
        $failed = $this->transport('failed');
        $bus = $this->bus(['orders' => $orders], function (OrderDue $m) {
            throw new RuntimeException("cannot close order {$m->orderId}");
        });
        $bus->dispatch(new OrderDue('7'));

        $dispatcher = new EventDispatcher();
        // What FrameworkBundle registers for a transport with retry_strategy {max_retries: 1,
        // delay: 1000} and a failure_transport.
        $dispatcher->addSubscriber(new AddErrorDetailsStampListener());
        $dispatcher->addSubscriber(new SendFailedMessageForRetryListener(
            new Services(['orders' => $orders]),
            new Services(['orders' => new MultiplierRetryStrategy(1, 1000, 1)]),
        ));
        $dispatcher->addSubscriber(new SendFailedMessageToFailureTransportListener(new Services(['orders' => $failed])));
        $this->consume($bus, ['orders' => $orders], $dispatcher, ['--limit' => 2]);

        $this->assertCount(2, $this->handled, 'the first delivery and one retry');
        $this->assertGreaterThanOrEqual(1.0, $this->handled[1]['at'] - $this->handled[0]['at'], 'the retry waited its 1 s');
        $this->assertSame(1, $this->handled[1]['stamps'][RedeliveryStamp::class][0]->getRetryCount());
        $stats = $this->queue('orders')->stats();
        $this->assertSame(2, $stats['acked'], 'each rejected delivery was deleted');
        $this->assertSame(0, $stats['scheduled'] + $stats['ready'] + $stats['inflight'] + $stats['dead']);

        $inFailureTransport = iterator_to_array($failed->all());
        $this->assertCount(1, $inFailureTransport);
        /** @var Envelope $envelope */
        $envelope = $inFailureTransport[0];
        $this->assertSame('7', $envelope->getMessage()->orderId);
        $this->assertSame('orders', $envelope->last(SentToFailureTransportStamp::class)->getOriginalReceiverName());
        $this->assertSame('cannot close order 7', $envelope->last(ErrorDetailsStamp::class)->getExceptionMessage());
    }

    public function testDelayqRetriesAndDeadLettersWhenConfigured(): void
    {
        $orders = $this->transport('orders', '?retry=delayq&max_attempts=2&backoff_base=0.2&backoff_max=0.5');
        $bus = $this->bus(['orders' => $orders], function (OrderDue $m) {
            throw new RuntimeException("cannot close order {$m->orderId}");
        });
        $bus->dispatch(new OrderDue('8'));

        $dispatcher = new EventDispatcher();
        $dispatcher->addSubscriber(new AddErrorDetailsStampListener());
        $this->consume($bus, ['orders' => $orders], $dispatcher, ['--limit' => 2]);

        $this->assertCount(2, $this->handled);
        $this->assertArrayNotHasKey(RedeliveryStamp::class, $this->handled[1]['stamps'], 'delayq retried the same message; Messenger did not re-send');
        $dead = $this->queue('orders')->deadLetters();
        $this->assertCount(1, $dead, 'after max_attempts=2 the message is a dead letter');
        $this->assertStringContainsString('RuntimeException: cannot close order 8', $dead[0]['last_error']);
        $this->assertSame(2, $dead[0]['attempts']);
    }

    public function testBadDsnOrOptionFailsNamingIt(): void
    {
        $factory = new TransportFactory([new DelayqTransportFactory()]);
        $serializer = new PhpSerializer();
        $port = $this->redis->port;
        $cases = [
            "delayq:///orders" => 'is invalid',
            "delayq://127.0.0.1:$port/orders?prefixx=dq" => "unknown DelayQueue option 'prefixx'",
            "delayq://127.0.0.1:$port/orders?retry=sometimes" => '"retry" must be "messenger" or "delayq"',
            "delayq://127.0.0.1:$port/orders?max_attempts=3" => 'needs retry=delayq',
            "delayq://127.0.0.1:$port/orders?lease=-1" => '"lease" must be a number of seconds above 0, "-1" given',
            "delayq://127.0.0.1:$port/orders?lease=abc" => '"lease" must be a number of seconds above 0, "abc" given',
            "delayq://127.0.0.1:$port/orders?wait=-1" => '"wait" must be a number of seconds (0 or more), "-1" given',
            "delayq://127.0.0.1:$port/orders?leas=5" => "the transport's own options: queue, db, lease, wait, retry, max_attempts",
        ];
        foreach ($cases as $dsn => $expected) {
            try {
                $factory->createTransport($dsn, ['transport_name' => 'orders'], $serializer);
                $this->fail("$dsn was accepted");
            } catch (InvalidArgumentException $e) {
                $this->assertStringContainsString($expected, $e->getMessage(), $dsn);
            }
        }
        $this->assertInstanceOf(TransportInterface::class,
            $factory->createTransport("delayq://127.0.0.1:$port/orders?prefix=dq", ['transport_name' => 'orders'], $serializer));

        // A password holding "/" or "@" is not shown, whatever part of the DSN is wrong.
        foreach (["delayq://app:Se/cr@et@127.0.0.1:$port/orders?prefixx=dq", "delayq://app:Secr@et@127.0.0.1:$port/orders?prefixx=dq"] as $dsn) {
            try {
                $factory->createTransport($dsn, ['transport_name' => 'orders'], $serializer);
                $this->fail("$dsn was accepted");
            } catch (InvalidArgumentException $e) {
                $this->assertStringNotContainsString('Se', $e->getMessage());
                $this->assertStringNotContainsString('et@', $e->getMessage());
                $this->assertStringContainsString('delayq://****@127.0.0.1', $e->getMessage());
            }
        }
    }

    private function transport(string $queue, string $query = ''): TransportInterface
    {
        $factory = new TransportFactory([new DelayqTransportFactory()]);
        return $factory->createTransport("delayq://127.0.0.1:{$this->redis->port}/$queue$query",
            ['transport_name' => $queue], new PhpSerializer());
    }

    /** @param array<string, TransportInterface> $transports */
    private function bus(array $transports, callable $handler): MessageBus
    {
        $record = function (OrderDue $message) use ($handler) {
            $this->handled[] = ['order' => $message->orderId, 'at' => microtime(true), 'stamps' => []];
            return $handler($message);
        };
        return new MessageBus([
            new SendMessageMiddleware(new SendersLocator([OrderDue::class => array_keys($transports)], new Services($transports))),
            new HandleMessageMiddleware(new HandlersLocator([OrderDue::class => [$record]])),
        ]);
    }

    /**
     * Runs messenger:consume until its --limit, with --time-limit as a bound on a hang.
     *
     * @param array<string, TransportInterface> $receivers
     */
    private function consume(MessageBus $bus, array $receivers, EventDispatcher $dispatcher, array $options): void
    {
        // The envelope as the worker received it, stamps and all, for each handled or failed delivery.
        $seen = function (WorkerMessageHandledEvent|WorkerMessageFailedEvent $event) {
            $last = array_key_last($this->handled);
            if ($last !== null && $this->handled[$last]['stamps'] === []) {
                $this->handled[$last]['stamps'] = $event->getEnvelope()->all();
            }
        };
        $dispatcher->addListener(WorkerMessageHandledEvent::class, $seen);
        $dispatcher->addListener(WorkerMessageFailedEvent::class, $seen, 100);
        $command = new ConsumeMessagesCommand(new RoutableMessageBus(new Services([]), $bus),
            new Services($receivers), $dispatcher, null, array_keys($receivers));
        $console = new Application();
        $console->setAutoExit(false);
        $console->setCatchExceptions(false);
        $console->add($command);
        $output = new BufferedOutput();
        $code = $console->run(new ArrayInput(['command' => 'messenger:consume', 'receivers' => array_keys($receivers),
            '--time-limit' => 60, '--sleep' => '0.1'] + $options), $output);
        $this->assertSame(0, $code, $output->fetch());
    }

    private function queue(string $name): DelayQueue
    {
        return new DelayQueue($this->redis->url(), $name);
    }
}
