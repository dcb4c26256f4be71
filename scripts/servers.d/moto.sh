#!/usr/bin/env bash
# moto server (S3 emulator) for the s3 object-store tests. It is a Python package in the root
# dev dependency group (`moto[server]`), so `uv sync` installs it; this only checks it is there.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -x .venv/bin/moto_server ]; then
  uv sync --all-packages --locked --quiet
fi
.venv/bin/python -c "import moto; print('moto', moto.__version__, 'installed')"
