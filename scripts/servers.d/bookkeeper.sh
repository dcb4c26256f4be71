#!/usr/bin/env bash
# Apache BookKeeper 4.17.3's jars from Maven Central (tests/support/bookkeeper-pom.xml:
# bookkeeper-server and its dependencies, ZooKeeper included), into .servers/bookkeeper-4.17.3/lib.
# The BookKeeper WAL plugin's tests (tests/support/bookkeeper.py) run a ZooKeeper and three
# bookies from them, and the plugin's JVM loads its ledger client from the same folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=4.17.3
DEST=.servers/bookkeeper-$VERSION/lib
POM=tests/support/bookkeeper-pom.xml
REQUIRED=("bookkeeper-server-$VERSION.jar" "zookeeper-3.9.3.jar" "metrics-core-4.1.12.1.jar"
  "snappy-java-1.1.10.5.jar")

. scripts/lib/maven-dependencies.sh
maven_dependencies "bookkeeper $VERSION" "$POM" "$DEST" "${REQUIRED[@]}"
