<?php

namespace App\Console;

use Illuminate\Console\Command;
use Illuminate\Support\Facades\Queue;

/** Dispatches one of the test jobs the way an application does, and prints its due time. */
class DispatchCommand extends Command
{
    protected $signature = 'app:dispatch {job : a class of App\\Jobs} {label} {--delay=0 : seconds}
                            {--later : through Queue::later() instead of dispatch()->delay()}
                            {--queue= : the queue, if not the default one}';

    public function handle()
    {
        $class = 'App\\Jobs\\' . $this->argument('job');
        $delay = (int) $this->option('delay');
        $job = new $class($this->argument('label'));
        if ($this->option('queue')) {
            $job->onQueue($this->option('queue'));
        }
        $due = microtime(true) + $delay;
        if ($this->option('later')) {
            Queue::later($delay, $job, '', $job->queue);
        } elseif ($delay > 0) {
            dispatch($job->delay(now()->addSeconds($delay)));
        } else {
            dispatch($job);
        }
        $this->line(json_encode(['due' => $due]));
        return 0;
    }
}
