<?php
// Prints the API shape of delayq's classes as JSON: run once with the extension and
// once (with -n, no extensions) on top of stubs/delayq.stub.php, then compared.
declare(strict_types=1);

if (isset($argv[1])) {
    require $argv[1];
}

function delayq_describe(): array
{
    $out = [];
    $classes = ['DelayQueue', 'DelayQueueWorker', 'DelayQueueMessage', 'DelayQueueConsumer', 'DelayQueueException',
        'DelayQueueInvalidArgumentException', 'DelayQueueConnectionException', 'DelayQueueTimeoutException',
        'DelayQueueAuthException', 'DelayQueuePayloadException', 'DelayQueueLeaseLostException',
        'DelayQueueOutOfMemoryException', 'DelayQueuePartialPushException', 'DelayQueueRedisPartialPushException',
        'DelayQueueConnectionPartialPushException', 'DelayQueueTimeoutPartialPushException',
        'DelayQueueAuthPartialPushException', 'DelayQueueOutOfMemoryPartialPushException'];
    foreach ($classes as $name) {
        if (!class_exists($name) && !interface_exists($name)) {
            $out[$name] = 'missing';
            continue;
        }
        $c = new ReflectionClass($name);
        $methods = [];
        foreach ($c->getMethods() as $m) {
            if ($m->getDeclaringClass()->getName() !== $name) {
                continue;
            }
            $params = [];
            foreach ($m->getParameters() as $p) {
                $params[] = [
                    'name' => $p->getName(),
                    'type' => (string) $p->getType(),
                    'optional' => $p->isOptional(),
                    'default' => $p->isDefaultValueAvailable() ? var_export($p->getDefaultValue(), true) : null,
                ];
            }
            $methods[$m->getName()] = [
                'params' => $params,
                'return' => $m->getName() === '__construct' ? '' : (string) $m->getReturnType(),
                'static' => $m->isStatic(),
            ];
        }
        ksort($methods);
        $props = [];
        foreach ($c->getProperties() as $p) {
            if ($p->getDeclaringClass()->getName() === $name) {
                $props[] = $p->getName();
            }
        }
        sort($props);
        $out[$name] = [
            'final' => $c->isFinal(),
            'parent' => $c->getParentClass() ? $c->getParentClass()->getName() : null,
            'methods' => $methods,
            'properties' => $props,
        ];
    }
    return $out;
}

echo json_encode(delayq_describe(), JSON_PRETTY_PRINT), "\n";
