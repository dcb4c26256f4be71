#!/usr/bin/env bash
# Oxia (metadata backend) for the oxia plugin's tests, built from source into .servers/bin/oxia.
#
# v0.14.0 is the newest Oxia the Go module proxy serves whose server builds from one module
# (v0.14.1-v0.14.4 answer 403; v0.15 is a multi-module workspace that `go build` cannot build
# from the proxy). `go install …/cmd@v0.14.0` fails on the proxy's tag list, so the module is
# downloaded, patched and built in place.
#
# The patch (oxia-v0.14.0-wal-append-order.patch) fixes a server race: a write takes its log
# offset and appends to the WAL in two steps, so two concurrent writes to one shard can reach
# the WAL out of order, after which the shard refuses every write ("invalid next offset in
# wal") until restarted. Without it the multi-process tests fail at random.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=v0.14.0
PATCH=scripts/servers.d/oxia-v0.14.0-wal-append-order.patch
BIN=.servers/bin/oxia
STAMP=.servers/oxia.version
WANT="$VERSION $(sha256sum "$PATCH" | cut -c1-16)"

if [ -x "$BIN" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ]; then
  echo "oxia $WANT already installed"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "oxia needs the Go toolchain (go) to build; install Go 1.23 or later" >&2
  exit 1
fi
mkdir -p .servers/bin .servers/src
module=$(go mod download -json "github.com/oxia-db/oxia@$VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
src=.servers/src/oxia-$VERSION
rm -rf "$src"
cp -r "$module" "$src"
chmod -R u+w "$src"
patch -s -d "$src" -p1 < "$PATCH"
(cd "$src" && go build -o "$OLDPWD/$BIN" ./cmd)
echo "$WANT" > "$STAMP"
echo "oxia $WANT installed in $BIN"
