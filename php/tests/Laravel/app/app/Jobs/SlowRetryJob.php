<?php

namespace App\Jobs;

/** FailingJob with a retry far enough away to look at the job while it waits. */
class SlowRetryJob extends FailingJob
{
    public $backoff = 30;
}
