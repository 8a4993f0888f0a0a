<?php

namespace App\Jobs;

/** Runs until the file "$DELAYQ_TEST_LOG.go" exists: a job still running when its test signals the worker. */
class WaitingJob extends RecordRun
{
    public function handle()
    {
        $this->record('started');
        $deadline = time() + 60;
        while (!is_file(getenv('DELAYQ_TEST_LOG') . '.go') && time() < $deadline) {
            usleep(20000);
        }
        $this->record('ran');
    }
}
