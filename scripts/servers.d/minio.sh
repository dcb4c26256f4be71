#!/usr/bin/env bash
# MinIO (S3-compatible server) for the tables-on-S3 tests and the cost-profile benchmarks,
# built from the Go module proxy into .servers/bin/minio (about two minutes on two cores).
# Pinned to the pseudo-version `@latest` resolved to when it was chosen, so every machine
# tests against the same server.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
BIN=.servers/bin/minio
STAMP=.servers/minio.version

if [ -x "$BIN" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$VERSION" ]; then
  echo "minio $VERSION already installed"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "minio needs the Go toolchain (go) to build; install Go 1.24 or later" >&2
  exit 1
fi
mkdir -p .servers/bin
GOBIN="$PWD/.servers/bin" go install "github.com/minio/minio@$VERSION"
echo "$VERSION" > "$STAMP"
echo "minio $VERSION installed in $BIN"
