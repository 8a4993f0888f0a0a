#!/usr/bin/env bash
# Builds the PHP extension against PHP 8.1, 8.3 and 8.4 and runs the whole PHPUnit
# suite on each, every version in a chroot of the distribution that ships it (this
# machine's Debian 12 has 8.2 alone, which `make test` covers):
#   8.1 Ubuntu 22.04 (jammy)   8.3 Ubuntu 24.04 (noble)   8.4 Debian 13 (trixie)
# Each chroot holds that distribution's own php-cli, php-dev, phpunit, php-redis,
# clang and redis-server; the build uses this machine's Rust toolchain and crates,
# mounted in. Chroots are kept in $DELAYQ_CHROOTS (default /var/cache/delayq-php) and
# reused. Needs root (debootstrap, chroot, mount).
#   scripts/php-versions.sh [8.1 8.3 8.4]
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
repo=$PWD
chroots=${DELAYQ_CHROOTS:-/var/cache/delayq-php}
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(8.1 8.3 8.4)
[ "$(id -u)" = 0 ] || { echo "php-versions.sh needs root (debootstrap, chroot, mount)" >&2; exit 1; }
command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >/dev/null

debian=http://deb.debian.org/debian
ubuntu=http://archive.ubuntu.com/ubuntu

# Ubuntu's archive key, from Debian's own ubuntu-keyring package: the trixie release
# file is checked against Debian's keyring, the package list against the release file
# and the package against the list, so no key is taken on trust.
ubuntu_keyring() {
  local out=$chroots/ubuntu-archive-keyring.gpg
  [ -s "$out" ] && { echo "$out"; return; }
  local tmp
  tmp=$(mktemp -d)
  curl -fsS -o "$tmp/InRelease" "$debian/dists/trixie/InRelease"
  gpgv --keyring /usr/share/keyrings/debian-archive-keyring.gpg --output "$tmp/Release" "$tmp/InRelease" 2>/dev/null
  # The architecture's list, which holds the packages for all architectures too.
  curl -fsS -o "$tmp/Packages.xz" "$debian/dists/trixie/main/binary-amd64/Packages.xz"
  local sum
  sum=$(awk '/^SHA256:/{on=1; next} /^[A-Za-z]/{on=0} on && $3=="main/binary-amd64/Packages.xz"{print $1}' "$tmp/Release")
  echo "$sum  $tmp/Packages.xz" | sha256sum -c --quiet >&2
  local entry
  entry=$(xz -dc "$tmp/Packages.xz" | awk -v RS= '/^Package: ubuntu-keyring\n/')
  local file deb_sum
  file=$(sed -n 's/^Filename: //p' <<<"$entry")
  deb_sum=$(sed -n 's/^SHA256: //p' <<<"$entry")
  curl -fsS -o "$tmp/keyring.deb" "$debian/$file"
  echo "$deb_sum  $tmp/keyring.deb" | sha256sum -c --quiet >&2
  dpkg-deb -x "$tmp/keyring.deb" "$tmp/x"
  install -m 0644 "$tmp/x/usr/share/keyrings/ubuntu-archive-keyring.gpg" "$out"
  rm -rf "$tmp"
  echo "$out"
}

# The chroot of one PHP version, made once: suite, mirror, keyring, components.
chroot_for() {
  local version=$1 suite mirror keyring components=main
  # Debian 12's debootstrap predates noble; every Ubuntu release since gutsy takes
  # that script.
  local script=
  case $version in
    8.1) suite=jammy; mirror=$ubuntu; components=main,universe; script=/usr/share/debootstrap/scripts/gutsy ;;
    8.3) suite=noble; mirror=$ubuntu; components=main,universe; script=/usr/share/debootstrap/scripts/gutsy ;;
    8.4) suite=trixie; mirror=$debian ;;
    8.2) echo "PHP 8.2 is this machine's own: make test covers it" >&2; return 1 ;;
    *) echo "no distribution here ships PHP $version (8.1, 8.3 and 8.4 can be tested)" >&2; return 1 ;;
  esac
  local dir=$chroots/$suite
  unmount_under "$dir"
  if [ ! -e "$dir/.delayq-complete" ]; then
    rm -rf --one-file-system "$dir"
    mkdir -p "$chroots"
    if [ "$mirror" = "$ubuntu" ]; then keyring=$(ubuntu_keyring); else keyring=/usr/share/keyrings/debian-archive-keyring.gpg; fi
    echo "== PHP $version: debootstrap $suite into $dir" >&2
    debootstrap --variant=minbase --components="$components" --keyring="$keyring" \
      --include="php$version-cli,php$version-dev,php$version-redis,phpunit,clang,libclang-dev,redis-server,pkg-config" \
      "$suite" "$dir" "$mirror" $script >"$chroots/$suite.log" 2>&1 \
      || { tail -20 "$chroots/$suite.log" >&2; return 1; }
    touch "$dir/.delayq-complete"
  fi
  echo "$dir"
}

# Mounts a killed run left behind: the repository and the toolchain must never be
# under a chroot that is removed or mounted again.
mounts_under() {
  awk -v under="$1/" 'index($2, under) == 1 {print $2}' /proc/mounts | sort -r
}
unmount_under() {
  local m
  mounts_under "$1" | while read -r m; do umount -l "$m"; done
  if [ -n "$(mounts_under "$1")" ]; then
    echo "cannot unmount what is mounted under $1" >&2
    return 1
  fi
}

mounted=()
unmount_all() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  mounted=()
}
trap unmount_all EXIT

bind() {
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounted+=("$2")
}

# The crates the build needs, fetched here, where the network and the index are.
cargo fetch -q

failed=()
for version in "${versions[@]}"; do
  # A chroot that cannot be made ends the run: that is this machine's fault, not PHP's.
  dir=$(chroot_for "$version")
  bind /proc "$dir/proc"
  bind /dev "$dir/dev"
  bind "$repo" "$dir$repo"
  bind "$HOME/.cargo" "$dir/root/.cargo"
  bind "${RUSTUP_HOME:-$HOME/.rustup}" "$dir/root/.rustup"
  echo "== PHP $version: build and PHPUnit ($(chroot "$dir" php -r 'echo PHP_VERSION;'), in $dir)"
  target=target/php-$version
  if chroot "$dir" /usr/bin/env -i HOME=/root PATH=/root/.cargo/bin:/usr/bin:/bin \
      CARGO_TARGET_DIR="$repo/$target" DELAYQ_EXTENSION="$repo/$target/release/libdelayq_php.so" \
      bash -c "cd '$repo' && cargo build -q --release --offline -p delayq-php \
        && cd php-ext && php -d extension=\"\$DELAYQ_EXTENSION\" /usr/bin/phpunit"; then
    echo "== PHP $version: passed"
  else
    failed+=("$version")
  fi
  unmount_all
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "== failed on PHP ${failed[*]}" >&2
  exit 1
fi
echo "== PHP ${versions[*]}: built and every PHPUnit test passed"
