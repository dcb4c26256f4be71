#!/usr/bin/env bash
# PostgreSQL (Debian's package) for the Iceberg SQL catalog on Postgres. Tests run their own
# server on a free loopback port with a data folder of their own; the package's own cluster,
# if it starts one, is not used.
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "postgresql already installed: $(ls -d /usr/lib/postgresql/*/ | tail -1)"
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
echo "postgresql installed: $(ls -d /usr/lib/postgresql/*/ | tail -1)"
