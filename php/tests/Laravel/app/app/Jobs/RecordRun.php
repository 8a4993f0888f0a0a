<?php

namespace App\Jobs;

use Illuminate\Bus\Queueable;
use Illuminate\Contracts\Queue\ShouldQueue;
use Illuminate\Foundation\Bus\Dispatchable;
use Illuminate\Queue\InteractsWithQueue;

/** Appends one JSON line per run to $DELAYQ_TEST_LOG: what ran, which attempt, when. */
class RecordRun implements ShouldQueue
{
    use Dispatchable, InteractsWithQueue, Queueable;

    public function __construct(public string $label)
    {
    }

    public function handle()
    {
        $this->record('ran');
    }

    protected function record(string $event): void
    {
        file_put_contents(getenv('DELAYQ_TEST_LOG'), json_encode([
            'label' => $this->label, 'event' => $event, 'attempt' => $this->attempts(),
            'at' => microtime(true), 'pid' => getmypid(), 'job_id' => $this->job?->getJobId(),
        ]) . "\n", FILE_APPEND | LOCK_EX);
    }
}
