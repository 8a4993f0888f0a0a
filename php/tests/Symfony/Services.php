<?php

declare(strict_types=1);

namespace Delayq\Tests\Symfony;

use Psr\Container\ContainerInterface;
use Psr\Container\NotFoundExceptionInterface;

/** The service locators Messenger takes (FrameworkBundle builds them from its container). */
final class Services implements ContainerInterface
{
    /** @param array<string, mixed> $services */
    public function __construct(private array $services)
    {
    }

    public function get(string $id)
    {
        if (!$this->has($id)) {
            throw new class ("no service \"$id\"") extends \RuntimeException implements NotFoundExceptionInterface {
            };
        }
        return $this->services[$id];
    }

    public function has(string $id): bool
    {
        return isset($this->services[$id]);
    }
}
