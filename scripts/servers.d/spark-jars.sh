#!/usr/bin/env bash
# The jars with which Apache Spark (the workspace's PySpark, in local mode) reads the Iceberg and
# Delta tables of a topic, from Maven Central into .servers/spark-jars (used by
# tests/support/spark_readers.py). Pinned by version and SHA-256; a jar already there with the
# right checksum is kept, one that is not in the list below is removed.
#
# Spark 4.1 (Scala 2.13), the line the workspace locks:
#   iceberg-spark-runtime-4.1_2.13 1.12.0  Iceberg's Spark runtime (1.11.0 is the first for 4.1)
#   delta-spark_4.1_2.13 4.1.0            Delta for Spark 4.1 and its log stores (later Delta
#   delta-storage 4.1.0                   releases also need the Delta kernel jars; the Unity
#                                         Catalog client delta-storage declares is not needed to
#                                         read a table by its path)
#   sqlite-jdbc 3.54.1.0                  Iceberg's JdbcCatalog on Icefloe's SQLite catalog file
# S3 (both formats):
#   iceberg-aws-bundle 1.12.0             Iceberg's S3FileIO with the AWS SDK v2 modules it uses
#                                         (S3, STS, the SDK core), not relocated
#   hadoop-aws 3.4.2                      S3A (s3:// and s3a:// for Delta), the same Hadoop as the
#                                         hadoop-client-* jars inside PySpark
#   apache-client, s3-transfer-manager    the two AWS SDK modules S3A needs that the Iceberg
#                                         bundle lacks, at the bundle's SDK version (2.54.17)
# hadoop-aws declares the AWS SDK's `bundle` jar (every service: 640 MB) as its dependency. S3A
# needs only S3, STS and the SDK core, which the Iceberg bundle (69 MB, needed for Iceberg
# anyway) holds unrelocated, plus the two modules above (360 KB): S3A runs on those.
set -euo pipefail
cd "$(dirname "$0")/../.."
SPARK_LINE=4.1
HADOOP_VERSION=3.4.2
DEST=.servers/spark-jars
MAVEN=https://repo1.maven.org/maven2
# group:artifact:version sha256
JARS=(
  "org.apache.iceberg:iceberg-spark-runtime-${SPARK_LINE}_2.13:1.12.0 3123c3798af642dd537230923548e013ef41cc28b6626e5225808cf5670a0f82"
  "io.delta:delta-spark_${SPARK_LINE}_2.13:4.1.0 9b05d7a82196ee1f1073733a45a2faae59161e52b86ae918fe6742fad6eaf036"
  "io.delta:delta-storage:4.1.0 6d0520ffcc35b582369f92c23fa24e14a5bb935cf6e31ed7f47c5046ae17cb25"
  "org.xerial:sqlite-jdbc:3.54.1.0 f8dce420a6016278497f4f0560f65602b9db858de141b541cf91a4644ebe4639"
  "org.apache.iceberg:iceberg-aws-bundle:1.12.0 dd7e49ffa4ac9b215bed846581991259e3aec9bb2fa08d6cec029c46cd66d957"
  "org.apache.hadoop:hadoop-aws:$HADOOP_VERSION d2d24e6b715b5656b9d238bf13b6682a07e2004dd36aad74a73aeb854319f4d9"
  "software.amazon.awssdk:apache-client:2.54.17 0b00ae3d55c3d1213ca47b5651dc4c2a0080fc9b6192dde3d53c3da6c1811bcb"
  "software.amazon.awssdk:s3-transfer-manager:2.54.17 7bef0ea4efd5e0860bab63e08317040951edb51b72a5be734284c28b8324ab87"
)

# The jars are built for one Spark line and one Hadoop: check the workspace's PySpark has them.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import pyspark" 2>/dev/null; then
  uv sync --all-packages --locked --quiet
fi
pyspark=$(.venv/bin/python -c "import pyspark; print(pyspark.__version__)")
case "$pyspark" in
  "$SPARK_LINE".*) ;;
  *) echo "spark-jars: these jars are for Spark $SPARK_LINE, the workspace has PySpark $pyspark;" \
       "update the versions in $0" >&2
     exit 1 ;;
esac
bundled=$(.venv/bin/python -c "import pathlib, pyspark; print(' '.join(p.name for p in (pathlib.Path(pyspark.__file__).parent / 'jars').glob('hadoop-client-api-*.jar')))")
if [ "$bundled" != "hadoop-client-api-$HADOOP_VERSION.jar" ]; then
  echo "spark-jars: hadoop-aws $HADOOP_VERSION does not match PySpark's Hadoop ($bundled);" \
    "update HADOOP_VERSION in $0" >&2
  exit 1
fi

if ! command -v curl >/dev/null 2>&1; then
  echo "installing curl (Debian package)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null
fi
mkdir -p "$DEST"
wanted=()
fetched=0
for entry in "${JARS[@]}"; do
  coordinates=${entry% *}
  sha256=${entry#* }
  IFS=: read -r group artifact version <<<"$coordinates"
  jar="$artifact-$version.jar"
  wanted+=("$jar")
  if [ -s "$DEST/$jar" ] && echo "$sha256  $DEST/$jar" | sha256sum --check --status; then
    continue
  fi
  url="$MAVEN/${group//.//}/$artifact/$version/$jar"
  echo "downloading $url"
  curl -fsSL --retry 3 -o "$DEST/$jar.part" "$url"
  if ! echo "$sha256  $DEST/$jar.part" | sha256sum --check --status; then
    rm -f "$DEST/$jar.part"
    echo "spark-jars: $url does not have the pinned SHA-256 $sha256" >&2
    exit 1
  fi
  mv "$DEST/$jar.part" "$DEST/$jar"
  fetched=$((fetched + 1))
done
for present in "$DEST"/*; do
  name=$(basename "$present")
  [[ " ${wanted[*]} " == *" $name "* ]] || rm -rf "$present"
done
if [ "$fetched" -eq 0 ]; then
  echo "spark-jars for Spark $SPARK_LINE already installed"
else
  echo "spark-jars for Spark $SPARK_LINE installed in $DEST ($(du -sh "$DEST" | cut -f1))"
fi
