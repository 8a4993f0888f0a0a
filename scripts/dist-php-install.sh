#!/usr/bin/env bash
# Installs the delayq.so beside this script into a PHP: the extension into its
# extension_dir, the ini into its conf.d. `make php-dist` copies this script into each
# dist/php/<PHP version>/ as install.sh, next to the build-info it checks against.
#
#   ./install.sh                              # the PHP of php-config on PATH (root, usually)
#   ./install.sh --php-config php-config8.3   # another installed PHP
#   ./install.sh --extension-dir DIR --ini-dir DIR   # somewhere else (no root needed)
#   ./install.sh --force ...                  # replace an ini that loads another delayq.so
#
# It refuses a PHP whose "PHP Extension Build" (API number, thread safety, debug) is
# not the one the extension was built for, before writing anything: PHP would refuse
# to load it anyway, with a less helpful message. It also leaves alone an existing
# delayq ini that loads another file than the one it installs (unless --force): that
# ini may serve another install, such as the system PHP's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

usage() {
  echo "usage:" >&2
  sed -n 's/^#   //p' "$0" >&2
  exit 2
}

php_config=php-config
extension_dir=
ini_dir=
force=no
while [ $# -gt 0 ]; do
  case "$1" in
    --php-config) [ $# -ge 2 ] || usage; php_config=$2; shift 2 ;;
    --extension-dir) [ $# -ge 2 ] || usage; extension_dir=$2; shift 2 ;;
    --ini-dir) [ $# -ge 2 ] || usage; ini_dir=$2; shift 2 ;;
    --force) force=yes; shift ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done

for part in delayq.so delayq.ini build-info; do
  [ -f "$here/$part" ] || { echo "$here/$part is missing: unpack the whole package" >&2; exit 1; }
done
built_for_version=$(sed -n 's/^php_version=//p' "$here/build-info")
built_for_build=$(sed -n 's/^extension_build=//p' "$here/build-info")

command -v "$php_config" >/dev/null || { echo "$php_config not found: install your PHP's development package (php$built_for_version-dev on Debian, Ubuntu) or name one with --php-config" >&2; exit 1; }
php_bin=$("$php_config" --php-binary)
[ -x "$php_bin" ] || { echo "$php_config names $php_bin as its PHP, which is missing" >&2; exit 1; }
php_version=$("$php_config" --version)
php_build=$("$php_bin" -n -i | sed -n 's/^PHP Extension Build => //p')

if [ "$php_build" != "$built_for_build" ]; then
  echo "this delayq.so was built for PHP $built_for_version ($built_for_build), but $php_config is PHP $php_version ($php_build)." >&2
  echo "Use the package built for PHP ${php_version%.*}, name that PHP with --php-config, or build one on a machine with this PHP: make php-dist" >&2
  exit 1
fi
# A matching API can still fail to load (a C library older than the build machine's):
# find out before anything is written.
load_error=$("$php_bin" -n -d "extension=$here/delayq.so" -r 'exit(class_exists("DelayQueue") ? 0 : 1);' 2>&1) \
  || { echo "$php_bin cannot load $here/delayq.so: ${load_error:-DelayQueue is missing after loading it}" >&2; exit 1; }

php_extension_dir=$("$php_config" --extension-dir)
extension_dir=$(readlink -m "${extension_dir:-$php_extension_dir}")
installed_so=$extension_dir/delayq.so

# The ini names the extension by file name when it sits in PHP's own extension_dir,
# by its full path otherwise.
if [ "$extension_dir" = "$(readlink -m "$php_extension_dir")" ]; then
  extension_line="extension=delayq"
else
  extension_line="extension=$installed_so"
fi
short_version=${php_version%.*}
if [ -z "$ini_dir" ] && [ -d "/etc/php/$short_version/mods-available" ] && command -v phpenmod >/dev/null; then
  # Debian and Ubuntu: one ini in mods-available, linked into every SAPI's conf.d.
  ini_dir=/etc/php/$short_version/mods-available
  ini_file=$ini_dir/delayq.ini
  enable_with_phpenmod=yes
else
  if [ -z "$ini_dir" ]; then
    ini_dir=$("$php_bin" --ini | sed -n 's/^Scan for additional .ini files in: //p' | cut -d: -f1)
    case "$ini_dir" in
      ""|"(none)") echo "$php_bin scans no conf.d directory: choose one with --ini-dir, or add '$extension_line' to its php.ini" >&2; exit 1 ;;
    esac
  fi
  ini_file=$ini_dir/30-delayq.ini
  enable_with_phpenmod=no
fi

# The file an ini's extension= value loads: PHP looks a bare name up in its
# extension_dir, and adds .so to a name without it.
loaded_file() {
  local value=$1
  case "$value" in */*) ;; *) value=$php_extension_dir/$value ;; esac
  case "$value" in *.so) ;; *) value=$value.so ;; esac
  readlink -m "$value"
}
# An ini already there is rewritten only when it loads the very file this install
# writes (an upgrade in place); one that loads another delayq.so belongs to another
# install, and rewriting it would move that install's PHP onto this one.
if [ -e "$ini_file" ]; then
  existing_lines=$(grep -E '^[[:space:]]*extension[[:space:]]*=' "$ini_file" || true)
  same=no
  if [ -n "$existing_lines" ]; then
    same=yes
    while IFS= read -r line; do
      value=$(printf '%s' "$line" | sed -e 's/^[^=]*=[[:space:]]*//' -e 's/[[:space:]]*$//' -e 's/^"\(.*\)"$/\1/')
      [ "$(loaded_file "$value")" = "$installed_so" ] || same=no
    done <<<"$existing_lines"
  fi
  if [ -n "$existing_lines" ]; then
    existing="with '${existing_lines//$'\n'/, }'"
  else
    existing="without an extension= line"
  fi
  if [ "$same" = no ] && [ "$force" = no ]; then
    echo "$ini_file already exists $existing, not '$extension_line': nothing installed." >&2
    echo "Pass --ini-dir DIR to put the ini somewhere else, or --force to replace $ini_file." >&2
    exit 1
  fi
  [ "$same" = yes ] || echo "== --force: replacing $ini_file, which existed $existing"
fi

mkdir -p "$extension_dir" 2>/dev/null || true
[ -w "$extension_dir" ] || { echo "cannot write $extension_dir: run as root (sudo), or choose --extension-dir" >&2; exit 1; }
mkdir -p "$ini_dir" 2>/dev/null || true
[ -w "$ini_dir" ] || { echo "cannot write $ini_dir: run as root (sudo), or choose --ini-dir" >&2; exit 1; }

install -m 0644 "$here/delayq.so" "$installed_so"
sed "s|^extension=.*|$extension_line|" "$here/delayq.ini" >"$ini_file"
if [ "$enable_with_phpenmod" = yes ]; then
  phpenmod -v "$short_version" delayq
  ini_file="$ini_file (enabled with phpenmod)"
fi
echo "== delayq.so for PHP $php_version installed: $installed_so, $ini_file"
