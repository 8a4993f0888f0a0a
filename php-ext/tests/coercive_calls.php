<?php
// No declare(strict_types=1): the calls below are made in PHP's default mode, in which
// PHP's own functions coerce their arguments ("30" for an int or float, 42 for a
// string); the extension's methods must do as they do.

function coercively(object $object, string $method, array $args): mixed
{
    return $object->$method(...$args);
}

function coercively_new(string $class, array $args): object
{
    return new $class(...$args);
}
