#!/usr/bin/env bash
# The Iceberg REST catalog fixture server (org.apache.iceberg:iceberg-open-api, a runnable jar
# with a JDBC/SQLite catalog inside) for the iceberg table plugin's REST tests, into
# .servers/iceberg-rest. 1.10.1: the last release that ships the runnable jar (1.11 dropped it).
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=1.10.1
DEST=.servers/iceberg-rest
JAR="$DEST/iceberg-open-api-$VERSION.jar"

if [ -s "$JAR" ]; then
  echo "iceberg-rest $VERSION already installed"
  exit 0
fi
for tool in java mvn; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "installing a JDK and Maven (Debian packages)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jdk-headless maven >/dev/null
    break
  fi
done
mkdir -p "$DEST"
mvn -q -B org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy \
  "-Dartifact=org.apache.iceberg:iceberg-open-api:$VERSION" "-DoutputDirectory=$DEST"
echo "iceberg-rest $VERSION installed in $JAR"
