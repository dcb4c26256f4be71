#!/usr/bin/env bash
# Apache Kafka 4.1.1's jars from Maven Central (tests/bench/sidebyside/kafka-pom.xml: the broker,
# kafka-tools and a Log4j 2 binding), into .servers/kafka-4.1.1/lib. The suite runs Kafka's own
# command-line tools from them (tests/integration/test_kafka_tools.py: kafka-topics,
# kafka-configs, kafka-consumer-groups, kafka-delete-records, kafka-log-dirs through their
# classes), and the side-by-side benchmark runs a Kafka broker from the same folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=4.1.1
DEST=.servers/kafka-$VERSION/lib
POM=tests/bench/sidebyside/kafka-pom.xml
REQUIRED=("kafka_2.13-$VERSION.jar" "kafka-tools-$VERSION.jar")

complete() {
  [ -e "$1/.complete" ] || return 1
  for jar in "${REQUIRED[@]}"; do
    [ -s "$1/$jar" ] || return 1
  done
}

if complete "$DEST"; then
  echo "kafka-jars $VERSION already installed"
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
  echo "kafka-jars: Maven did not fetch ${REQUIRED[*]} into $partial" >&2
  exit 1
fi
rm -rf "$DEST"
mv "$partial" "$DEST"
echo "kafka-jars $VERSION installed in $DEST ($(du -sh "$DEST" | cut -f1))"
