<?php
declare(strict_types=1);

use PHPUnit\Framework\TestCase;

final class StubTest extends TestCase
{
    public function testTheStubFileDescribesTheLoadedExtensionExactly(): void
    {
        $stub = dirname(__DIR__, 2) . '/stubs/delayq.stub.php';
        $fromExtension = shell_exec(implode(' ', array_map('escapeshellarg', array_merge(delayq_php_command(),
            [__DIR__ . '/describe.php']))));
        $fromStub = shell_exec(implode(' ', array_map('escapeshellarg', [PHP_BINARY, '-n', __DIR__ . '/describe.php', $stub])));
        $ext = json_decode((string) $fromExtension, true);
        $stubbed = json_decode((string) $fromStub, true);
        $this->assertIsArray($ext, 'describe.php with the extension printed no JSON');
        $this->assertIsArray($stubbed, 'describe.php on the stub printed no JSON');
        $this->assertNotContains('missing', $ext);
        $this->assertArrayHasKey('push', $ext['DelayQueue']['methods']);
        $this->assertSame($ext, $stubbed);
    }
}
