#!/usr/bin/env bash
# build-servers.sh [NAME ...]
#
# Builds the newer servers of the compatibility matrix (docs/compatibility.md) from Debian's
# source packages, core server only (no modules, no TLS, libc malloc): the binaries the
# `server_matrix` tests start beside Debian bookworm's own redis-server 7.0.15.
#
#   NAME          source package          from suite   binary
#   redis-8.0     redis 5:8.0.6-3         sid          $CACHE/redis-8.0/bin/redis-server
#   valkey-9.1    valkey 9.1.2-1          sid          $CACHE/valkey-9.1/bin/valkey-server
#   valkey-8.1    valkey 8.1.1+dfsg1-3*   trixie       $CACHE/valkey-8.1/bin/valkey-server
#   redis-6.0     redis 5:6.0.16-*        bullseye     $CACHE/redis-6.0/bin/redis-server
#                 (older than the proxy supports: tests/newer_commands.rs checks that /readyz
#                 says so; Debian has no 6.2)
#
# Default NAMEs: redis-8.0 valkey-9.1 redis-6.0 (what CI builds; valkey-8.1 on request).
# CACHE is ${RPP_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/redis-policy-proxy/servers}; a
# server whose binary is already there is not rebuilt (a few minutes each on 2 cores otherwise).
# The Tcl suite of each source tree is kept beside it ($CACHE/NAME/tests) for
# tests/conformance/server-units.sh.
#
# The apt source list is private (Dir::Etc::SourceList under $CACHE/apt): the machine's own
# sources are not touched. Prints one line per server: NAME=path-to-binary, or NAME=failed:why.
# Exits 0 when every requested server is there.
set -uo pipefail

cache=${RPP_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/redis-policy-proxy/servers}
mkdir -p "$cache/apt/lists/partial" "$cache/apt/cache/archives/partial"

names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(redis-8.0 valkey-9.1 redis-6.0)

# name -> "package version-glob suite binary-name"
spec() {
  case $1 in
    redis-8.0) echo "redis 5:8.0.6-* sid redis" ;;
    valkey-9.1) echo "valkey 9.1.2-* sid valkey" ;;
    valkey-8.1) echo "valkey 8.1.1* trixie valkey" ;;
    redis-6.0) echo "redis 5:6.0.16-* bullseye redis" ;;
    *) return 1 ;;
  esac
}

apt_opts=(
  -o "Dir::Etc::SourceList=$cache/apt/sources.list"
  -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$cache/apt/lists"
  -o "Dir::Cache=$cache/apt/cache"
  -o "APT::Sandbox::User=root"
)
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
cat >"$cache/apt/sources.list" <<EOF
deb-src [signed-by=$keyring] http://deb.debian.org/debian trixie main
deb-src [signed-by=$keyring] http://deb.debian.org/debian sid main
deb-src [signed-by=$keyring] http://deb.debian.org/debian bullseye main
EOF

updated=0
status=0
for name in "${names[@]}"; do
  read -r pkg version suite bin <<<"$(spec "$name")" || { echo "$name=failed:unknown name"; status=1; continue; }
  dir=$cache/$name
  if [[ -x $dir/bin/$bin-server ]]; then
    echo "$name=$dir/bin/$bin-server"
    continue
  fi
  if [[ $updated -eq 0 ]]; then
    apt-get "${apt_opts[@]}" update -qq >/dev/null 2>&1 || { echo "$name=failed:apt-get update"; status=1; continue; }
    updated=1
  fi
  # The newest version of the package in the wanted suite that matches the glob.
  full=$(apt-cache "${apt_opts[@]}" showsrc "$pkg" 2>/dev/null | awk '/^Version:/{print $2}' \
    | while read -r v; do [[ $v == $version ]] && echo "$v"; done | head -1)
  [[ -n $full ]] || { echo "$name=failed:no $pkg $version source in $suite"; status=1; continue; }
  work=$(mktemp -d)
  if ! (cd "$work" && apt-get "${apt_opts[@]}" source --download-only -qq "$pkg=$full" >/dev/null 2>&1); then
    echo "$name=failed:apt-get source $pkg=$full"; status=1; rm -rf "$work"; continue
  fi
  tarball=$(ls "$work"/*.orig.tar.* 2>/dev/null | head -1)
  mkdir -p "$work/tree"
  tar -xf "$tarball" -C "$work/tree" --strip-components=1
  # Core server only: no modules (Redis 8's BUILD_WITH_MODULES stays off), no TLS, libc malloc
  # (no jemalloc build), so it builds with gcc and make alone.
  if ! make -C "$work/tree" -j"$(nproc)" MALLOC=libc BUILD_TLS=no USE_SYSTEMD=no \
      >"$work/build.log" 2>&1; then
    mkdir -p "$dir"; cp "$work/build.log" "$dir/build.log"
    echo "$name=failed:make (log in $dir/build.log)"; status=1; rm -rf "$work"; continue
  fi
  rm -rf "$dir"
  mkdir -p "$dir/bin"
  cp "$work/tree/src/$bin-server" "$work/tree/src/$bin-cli" "$dir/bin/"
  # The Tcl suite runs the server as src/<bin>-server relative to its tree.
  cp -r "$work/tree/tests" "$dir/tests"
  mkdir -p "$dir/src"
  ln -s "../bin/$bin-server" "$dir/src/$bin-server"
  ln -s "../bin/$bin-cli" "$dir/src/$bin-cli"
  # Redis's suite calls src/redis-server and src/redis-cli even in Valkey's tree of old
  for b in server cli; do [[ -e $dir/src/redis-$b ]] || ln -s "../bin/$bin-$b" "$dir/src/redis-$b"; done
  [[ -d $work/tree/utils ]] && cp -r "$work/tree/utils" "$dir/utils"
  echo "$full" >"$dir/version"
  rm -rf "$work"
  echo "$name=$dir/bin/$bin-server"
done
exit $status
