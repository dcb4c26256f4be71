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

complete() {
  [ -e "$1/.complete" ] || return 1
  for jar in "${REQUIRED[@]}"; do
    [ -s "$1/$jar" ] || return 1
  done
}

if complete "$DEST"; then
  echo "bookkeeper $VERSION already installed"
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
partial="$PWD/$DEST.partial"
rm -rf "$partial"
mkdir -p "$partial"
command=(mvn -q -B -f "$POM" org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies
  -DincludeScope=runtime "-DoutputDirectory=$partial")
"${command[@]}"
echo "${command[*]}" >"$partial/.complete"
if ! complete "$partial"; then
  echo "bookkeeper: Maven did not fetch ${REQUIRED[*]} into $partial ($(ls "$partial" | tr '\n' ' '))" >&2
  exit 1
fi
rm -rf "$DEST"
mv "$partial" "$DEST"
echo "bookkeeper $VERSION installed in $DEST ($(du -sh "$DEST" | cut -f1))"
