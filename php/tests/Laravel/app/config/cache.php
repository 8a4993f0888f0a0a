<?php

return [
    // queue:restart and queue:work share the restart timestamp through this store.
    'default' => 'file',
    'stores' => [
        'file' => ['driver' => 'file', 'path' => storage_path('framework/cache/data')],
    ],
    'prefix' => 'delayq_test',
];
