<?php

namespace App\Jobs;

/** Its first attempt outlives its $timeout (Laravel's worker kills it); later ones finish at once. */
class TimeoutJob extends RecordRun
{
    public $timeout = 2;

    public function handle()
    {
        $this->record('started');
        if ($this->attempts() === 1) {
            sleep(30);
        }
        $this->record('ran');
    }

    public function failed($e)
    {
        $this->record('failed-hook');
    }
}
