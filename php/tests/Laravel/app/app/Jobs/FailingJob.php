<?php

namespace App\Jobs;

use RuntimeException;

/** Fails until the file "$DELAYQ_TEST_LOG.fixed" exists (the deploy of a fix). */
class FailingJob extends RecordRun
{
    public $tries = 3;
    public $backoff = [1, 2];

    public function handle()
    {
        if (is_file(getenv('DELAYQ_TEST_LOG') . '.fixed')) {
            $this->record('ran');
            return;
        }
        $this->record('failed');
        throw new RuntimeException("payment provider down for {$this->label}");
    }
}
