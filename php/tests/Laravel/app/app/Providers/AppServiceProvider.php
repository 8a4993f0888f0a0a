<?php

namespace App\Providers;

use Illuminate\Support\Facades\Queue;
use Illuminate\Support\ServiceProvider;

/** What an application may do at boot, switched on by the tests that need it. */
class AppServiceProvider extends ServiceProvider
{
    public function boot()
    {
        // A provider that uses its queue connection at boot, before artisan runs a command.
        if (env('DELAYQ_TEST_QUEUE_AT_BOOT')) {
            Queue::connection();
        }
    }
}
