<?php

declare(strict_types=1);

namespace Delayq\Tests\Symfony;

/** A message of the application: "close order $orderId if still unpaid". */
final class OrderDue
{
    public function __construct(public string $orderId)
    {
    }
}
