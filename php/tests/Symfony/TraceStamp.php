<?php

declare(strict_types=1);

namespace Delayq\Tests\Symfony;

use Symfony\Component\Messenger\Stamp\StampInterface;

/** An application's own stamp, which must come back from the transport as it went in. */
final class TraceStamp implements StampInterface
{
    public function __construct(public string $requestId)
    {
    }
}
