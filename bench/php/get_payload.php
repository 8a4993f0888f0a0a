<?php
// Issue 29, item 3: get() of one message whose payload holds 100 orders, $argv[1]
// times, to count under callgrind what reading a stored payload costs the client:
//   valgrind --tool=callgrind php bench/php/get_payload.php N [URL]
$q = new DelayQueue($argv[2] ?? "redis://127.0.0.1:6379", "decode");
$orders = [];
for ($i = 0; $i < 100; $i++) { $orders[] = ["order_id" => 10086 + $i, "action" => "close", "amount" => 12.5, "tags" => ["a", "b"]]; }
$id = $q->push(["orders" => $orders], 3600);
$n = (int) $argv[1];
for ($i = 0; $i < $n; $i++) { $q->get($id); }
