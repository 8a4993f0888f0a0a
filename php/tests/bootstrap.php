<?php
declare(strict_types=1);

if (!extension_loaded('delayq')) {
    fwrite(STDERR, "the delayq extension is not loaded: run php -d extension=/path/to/libdelayq_php.so\n");
    exit(1);
}
foreach (['pcntl', 'posix', 'pdo_sqlite'] as $needed) {
    if (!extension_loaded($needed)) {
        fwrite(STDERR, "the framework tests need PHP's $needed extension: run scripts/setup.sh\n");
        exit(1);
    }
}
require __DIR__ . '/autoload.php';
