<?php

namespace App\Jobs;

/** Its first attempt hangs (until its worker is killed); later ones finish at once. */
class SlowJob extends RecordRun
{
    public $tries = 3;

    public function handle()
    {
        $this->record('started');
        if ($this->attempts() === 1) {
            sleep(600);
        }
        $this->record('ran');
    }
}
