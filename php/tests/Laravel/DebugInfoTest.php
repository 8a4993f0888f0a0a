<?php

declare(strict_types=1);

namespace Delayq\Tests\Laravel;

use Delayq\Laravel\DelayqQueue;
use PHPUnit\Framework\TestCase;

/** The queue object, dumped while debugging, shows no password. */
final class DebugInfoTest extends TestCase
{
    public function testPrintRAndVarDumpHideTheUrlsPassword(): void
    {
        $queue = new DelayqQueue('redis://app:s3cr%40t%2Fx@127.0.0.1:6379/0', 'default', [], 90.0);
        ob_start();
        var_dump($queue);
        $dumped = (string) ob_get_clean();
        foreach ([print_r($queue, true), $dumped] as $shown) {
            $this->assertStringNotContainsString('s3cr', $shown);
            $this->assertStringNotContainsString('app', $shown);
            $this->assertStringContainsString('redis://****@127.0.0.1:6379/0', $shown);
        }
    }
}
