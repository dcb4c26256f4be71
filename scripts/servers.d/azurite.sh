#!/usr/bin/env bash
# Azurite (Azure Storage emulator) for the azure object-store tests, into .servers/azurite.
# Pinned: 3.36+ needs Node 21+, and this machine's Debian Node is 20.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=3.35.0
DEST=.servers/azurite

if ! command -v npm >/dev/null 2>&1; then
  echo "installing Node.js and npm (Debian packages)"
  apt-get update -qq
  apt-get install -y -qq nodejs npm >/dev/null
fi

installed=$(node -p "require('./$DEST/node_modules/azurite/package.json').version" 2>/dev/null || true)
if [ "$installed" = "$VERSION" ]; then
  echo "azurite $VERSION already installed"
  exit 0
fi
mkdir -p "$DEST"
npm install --prefix "$DEST" --no-audit --no-fund --loglevel=error "azurite@$VERSION"
echo "azurite $VERSION installed in $DEST"
