# Sourced by scripts/php-versions.sh and scripts/redis-versions.sh: chroots of other
# Debian and Ubuntu releases, made once with debootstrap and kept in $DELAYQ_CHROOTS
# (default /var/cache/delayq-php), in which this repository is built and tested with
# this machine's Rust toolchain and crates, mounted in. Needs root.
set -euo pipefail
shopt -s inherit_errexit

chroots=${DELAYQ_CHROOTS:-/var/cache/delayq-php}
[ "$(id -u)" = 0 ] || { echo "$(basename "$0") needs root (debootstrap, chroot, mount)" >&2; exit 1; }
command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >/dev/null

# The Debian archive this machine's apt uses: its own sources name the host, this
# repository names none.
apt_mirror() {
  local found
  found=$({
    sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | tr ' ' '\n'
    sed -n 's/^deb \(\[[^]]*\] *\)\{0,1\}\([^ ]*\).*/\2/p' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null
  } | grep -v -- '-security' | grep -m1 . || true)
  [ -n "$found" ] || { echo "no Debian archive in this machine's apt sources" >&2; return 1; }
  echo "${found%/}"
}

# Ubuntu's archive key, from Debian's own ubuntu-keyring package: the trixie release
# file is checked against Debian's keyring, the package list against the release file
# and the package against the list, so no key is taken on trust.
ubuntu_keyring() {
  local out=$chroots/ubuntu-archive-keyring.gpg
  [ -s "$out" ] && { echo "$out"; return; }
  local tmp debian
  debian=$(apt_mirror)
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

mounts_under() {
  awk -v under="$1/" 'index($2, under) == 1 {print $2}' /proc/mounts | sort -r
}

# Mounts a killed run left behind: the repository and the toolchain must never be
# under a chroot that is removed or mounted again.
unmount_under() {
  local m
  mounts_under "$1" | while read -r m; do umount -l "$m"; done
  if [ -n "$(mounts_under "$1")" ]; then
    echo "cannot unmount what is mounted under $1" >&2
    return 1
  fi
}

# The chroot of one release (jammy, noble, trixie, sid) holding at least the packages
# given (comma-separated); made once, and given the packages it lacks when reused.
# debootstrap fetches from its own default mirror for the suite.
chroot_with() {
  local suite=$1 packages=$2 ubuntu= keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  local components=main script=
  case $suite in
    jammy | noble)
      ubuntu=1
      components=main,universe
      # Debian 12's debootstrap predates noble; every Ubuntu release since gutsy
      # takes that script.
      script=/usr/share/debootstrap/scripts/gutsy
      ;;
    trixie | sid) ;;
    *) echo "no chroot recipe for $suite" >&2; return 1 ;;
  esac
  local dir=$chroots/$suite
  unmount_under "$dir"
  if [ ! -e "$dir/.delayq-complete" ]; then
    rm -rf --one-file-system "$dir"
    mkdir -p "$chroots"
    [ -n "$ubuntu" ] && keyring=$(ubuntu_keyring)
    echo "== debootstrap $suite into $dir" >&2
    # With a script (Ubuntu's) the mirror argument comes before it: "" is the default.
    debootstrap --variant=minbase --components="$components" --keyring="$keyring" --include="$packages" \
      "$suite" "$dir" ${script:+""} $script >"$chroots/$suite.log" 2>&1 \
      || { tail -20 "$chroots/$suite.log" >&2; return 1; }
    touch "$dir/.delayq-complete"
  else
    local missing
    missing=$(tr ',' '\n' <<<"$packages" | while read -r p; do
      chroot "$dir" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"
    done)
    if [ -n "$missing" ]; then
      echo "== $suite: installing $(echo $missing)" >&2
      # shellcheck disable=SC2086
      # Signatures are checked; a release file past its Valid-Until is taken (the mirror
      # here can serve sid's days late, which debootstrap takes too).
      { chroot "$dir" apt-get -o Acquire::Check-Valid-Until=false update -q \
        && chroot "$dir" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing; } \
        >>"$chroots/$suite.log" 2>&1 || { tail -20 "$chroots/$suite.log" >&2; return 1; }
    fi
  fi
  echo "$dir"
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

# Runs a shell command in the repository inside the chroot, with the toolchain and
# crates mounted in and CARGO_TARGET_DIR set to target/<name> (each release its own:
# what one links, another's libc may not load). Returns the command's status.
in_chroot() {
  local dir=$1 name=$2 command=$3 repo=$PWD status=0
  bind /proc "$dir/proc"
  bind /dev "$dir/dev"
  bind "$repo" "$dir$repo"
  bind "$HOME/.cargo" "$dir/root/.cargo"
  bind "${RUSTUP_HOME:-$HOME/.rustup}" "$dir/root/.rustup"
  chroot "$dir" /usr/bin/env -i HOME=/root PATH=/root/.cargo/bin:/usr/bin:/bin \
    CARGO_TARGET_DIR="$repo/target/$name" bash -c "cd '$repo' && $command" || status=$?
  unmount_all
  return $status
}

# For each item (a PHP or Redis version): `prepare ITEM` prints the chroot to use,
# then `check ITEM DIR` runs the tests there. Says which passed, and fails at the end
# if any did not. A chroot that cannot be made ends the run at once (that is this
# machine's fault, not the version's): `prepare` runs where errexit holds, which it
# does not in the condition of an `if`.
each_passes() {
  local what=$1 prepare=$2 check=$3 item dir failed=()
  shift 3
  for item; do
    dir=$("$prepare" "$item")
    if "$check" "$item" "$dir"; then echo "== $what $item: passed"; else failed+=("$item"); fi
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "== failed on $what ${failed[*]}" >&2
    return 1
  fi
  echo "== $what $*: passed"
}

# The crates the builds need, fetched here, where the network and the index are.
cargo fetch -q
