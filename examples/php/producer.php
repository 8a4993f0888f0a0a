<?php
// The recipe's producer.php, done with delayq: schedule "close this unpaid order"
// jobs. One call per message replaces HSET + ZADD; pushMany sends a batch in one
// round trip.
//   php producer.php [count]        (REDIS_URL defaults to redis://127.0.0.1:6379)
declare(strict_types=1);

$queue = new DelayQueue(getenv('REDIS_URL') ?: 'redis://127.0.0.1:6379', 'orders');

// One order: close it in 30 minutes unless paid. The id makes the push idempotent,
// so a retried request cannot schedule the same order twice.
$id = $queue->push(['order_id' => 10086, 'action' => 'close'], 30 * 60, ['id' => 'close-order-10086']);
echo "scheduled order 10086 to close in 30 minutes as $id\n";
$queue->cancel($id); // paid after all

// A burst: orders due 1 to 4 seconds from now, in one round trip.
$count = (int) ($argv[1] ?? 2000);
$items = [];
for ($i = 0; $i < $count; $i++) {
    $items[] = ['payload' => ['order_id' => 20000 + $i, 'action' => 'close'], 'delay' => 1.0 + 3.0 * $i / $count];
}
$queue->pushMany($items);
$stats = $queue->stats();
echo "scheduled $count orders due in 1 to 4 s; queue: {$stats['scheduled']} scheduled, {$stats['ready']} ready\n";
