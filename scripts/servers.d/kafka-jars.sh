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

. scripts/lib/maven-dependencies.sh
maven_dependencies "kafka-jars $VERSION" "$POM" "$DEST" "${REQUIRED[@]}"
