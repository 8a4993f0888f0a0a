<?php

declare(strict_types=1);

namespace Delayq\Symfony;

use Symfony\Component\Messenger\Stamp\NonSendableStampInterface;

/** Marks an envelope received from delayq: the message id its ack() or reject() applies to. */
final class DelayqReceivedStamp implements NonSendableStampInterface
{
    public function __construct(public readonly string $id)
    {
    }
}
