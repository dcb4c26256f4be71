#!/usr/bin/env bash
# etcd (metadata backend) for the etcd plugin's tests: Debian's etcd-server. Tests start their
# own etcd on free loopback ports; a system etcd that the package may start on 2379 is left
# alone (it is not in the way).
set -euo pipefail
if command -v etcd >/dev/null 2>&1; then
  echo "etcd already installed: $(etcd --version | head -1)"
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
echo "etcd installed: $(etcd --version | head -1)"
