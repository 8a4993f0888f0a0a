<?php

return [
    'default' => env('QUEUE_CONNECTION', 'delayq'),
    'connections' => [
        'delayq' => [
            'driver' => 'delayq',
            'url' => env('DELAYQ_URL'),
            'queue' => 'default',
            'retry_after' => (int) env('DELAYQ_RETRY_AFTER', 90),
            'options' => json_decode(env('DELAYQ_OPTIONS', '{}'), true),
        ] + json_decode(env('DELAYQ_EXTRA_CONFIG', '{}'), true),
        // Laravel's own Redis driver on the same Redis, for what Laravel does with it.
        'redis' => [
            'driver' => 'redis',
            'connection' => 'default',
            'queue' => 'default',
            'retry_after' => (int) env('DELAYQ_RETRY_AFTER', 90),
            'block_for' => null,
        ],
    ],
    'failed' => [
        'driver' => 'database-uuids',
        'database' => 'sqlite',
        'table' => 'failed_jobs',
    ],
];
