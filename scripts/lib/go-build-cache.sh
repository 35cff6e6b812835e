# shellcheck shell=bash
# The cache protocol shared by scripts/build-kube, scripts/build-runtime and scripts/build-kueue:
# one directory per key under a cache root, published by one rename, builders
# of one key serialized on a flock. Sourced, not run. See docs/kube-build.md.
#
#   go_cache_require_tools PROG        exit 3 unless go, flock and sha256sum are on PATH
#   go_cache_open PROG ROOT_VAR DEFAULT_ROOT KEY
#                                      prints the bin path and exits 0 when the entry
#                                      exists; otherwise takes the key's lock and sets
#                                      GO_CACHE_TMP (an empty build directory with bin/)
#                                      and GO_CACHE_FINAL / GO_CACHE_BIN
#   go_cache_publish                   renames GO_CACHE_TMP into place, prints the bin path

go_cache_require_tools() {
  local prog=$1 t
  for t in go flock sha256sum; do
    if ! command -v "$t" >/dev/null 2>&1; then
      if [[ $t == go ]]; then
        echo "$prog: go is not on PATH; cannot build the binaries" >&2
      else
        echo "$prog: $t is not on PATH; cannot build the binaries" >&2
      fi
      exit 3
    fi
  done
}

# _go_cache_entry ROOT KEY: set GO_CACHE_FINAL and GO_CACHE_BIN for KEY under ROOT; when that
# entry is published (it appeared by one rename, so it is complete) print its bin path and exit 0.
_go_cache_entry() {
  GO_CACHE_FINAL=$1/$2
  GO_CACHE_BIN=$GO_CACHE_FINAL/bin
  if [[ -d $GO_CACHE_BIN ]]; then
    echo "$GO_CACHE_BIN"
    exit 0
  fi
}

go_cache_open() {
  local prog=$1 root_var=$2 default_root=$3 key=$4
  local override=${!root_var:-}
  local cache_root=${override:-$default_root}
  _go_cache_entry "$cache_root" "$key"

  if ! mkdir -p "$cache_root" 2>/dev/null || [[ ! -w $cache_root ]]; then
    # A user who cannot write the machine's cache (not root) builds into their own.
    if [[ -z $override ]]; then
      cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/$(basename "$default_root")
      _go_cache_entry "$cache_root" "$key"
    fi
    if ! mkdir -p "$cache_root" 2>/dev/null || [[ ! -w $cache_root ]]; then
      echo "$prog: cache directory $cache_root is not writable (set $root_var)" >&2
      exit 1
    fi
  fi

  exec 9>"$cache_root/.$key.lock"
  if ! flock -n 9; then
    echo "$prog: another build of $key is running; waiting for it" >&2
    flock 9
  fi

  # Someone else may have finished while we waited.
  _go_cache_entry "$cache_root" "$key"

  # We hold the lock for this key, so any temporary directory for it is stale.
  rm -rf "$cache_root/.$key.tmp."*
  GO_CACHE_TMP=$(mktemp -d "$cache_root/.$key.tmp.XXXXXX")
  # shellcheck disable=SC2064  # expand now: the trap must remove this directory
  trap "rm -rf '$GO_CACHE_TMP'" EXIT
  trap 'exit 1' INT TERM HUP
  mkdir "$GO_CACHE_TMP/bin"
}

go_cache_publish() {
  chmod 0755 "$GO_CACHE_TMP"
  mv -T "$GO_CACHE_TMP" "$GO_CACHE_FINAL"
  trap - EXIT
  echo "$GO_CACHE_BIN"
}

# go_cache_check PROG WANT CMD...: exit 1 unless the first lines CMD prints
# contain WANT (refuse to publish binaries that do not report the pinned version).
go_cache_check() {
  local prog=$1 want=$2; shift 2
  local got
  got=$("$@" 2>&1 | head -n 3) || true
  if [[ $got != *"$want"* ]]; then
    echo "$prog: version check failed: '$*' printed '$got', want '$want'" >&2
    exit 1
  fi
}
