<?php

declare(strict_types=1);

namespace Delayq;

/** Thrown in a claimed message's handler by Claim::fail(): its text is the message's last error. */
final class ClaimFailedException extends \RuntimeException
{
}
