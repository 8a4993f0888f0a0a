<?php

return [
    'default' => 'sqlite',
    'connections' => [
        'sqlite' => [
            'driver' => 'sqlite',
            'database' => database_path('database.sqlite'),
            'prefix' => '',
            'foreign_key_constraints' => true,
        ],
    ],
    'migrations' => 'migrations',
    // For the 'redis' queue connection: Laravel's own Redis driver, the reference of some tests.
    'redis' => [
        'client' => 'phpredis',
        'default' => ['url' => env('DELAYQ_URL')],
    ],
];
