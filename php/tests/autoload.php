<?php
// Loads the frameworks from Debian's packages (php-laravel-framework, php-symfony-messenger,
// each with its own autoload.php under /usr/share/php) and this package by PSR-4, as
// Composer's autoloader would: the tests need no Composer download.
declare(strict_types=1);

require_once '/usr/share/php/Illuminate/autoload.php';
if (is_file('/usr/share/php/Symfony/Component/Messenger/autoload.php')) {
    require_once '/usr/share/php/Symfony/Component/Messenger/autoload.php';
}

spl_autoload_register(static function (string $class): void {
    $roots = [
        'Delayq\\Tests\\' => __DIR__ . '/',
        'Delayq\\' => dirname(__DIR__) . '/src/',
        // The Laravel test application's own classes (config/app.php's App namespace).
        'App\\' => __DIR__ . '/Laravel/app/app/',
    ];
    foreach ($roots as $prefix => $dir) {
        if (str_starts_with($class, $prefix)) {
            $file = $dir . str_replace('\\', '/', substr($class, strlen($prefix))) . '.php';
            if (is_file($file)) {
                require $file;
            }
            return;
        }
    }
});
require_once __DIR__ . '/functions.php';
