"""Apache Spark as a reader of Icefloe's tables: the Iceberg table through the same SQL catalog
Icefloe commits to, the Delta table by its location, each configured only from what the object
store plugin hands engines (``iceberg_properties()`` and ``engine_options()``).

Spark runs in local mode with the jars ``scripts/servers.d/spark-jars.sh`` puts in
``.servers/spark-jars``. A JVM takes its jars when it starts, and PySpark keeps one JVM per
process for good; another Spark test in the same pytest process may already have started one
without these jars. So :class:`SparkReader` runs Spark in a process of its own: one JVM and one
SparkSession for as long as the reader lives, and a fresh session (Spark's ``newSession()``,
sharing that JVM) for each read, holding that read's catalog and store settings.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, Final

from icefloe.testing.table_contract import Row, rows_of
from tests.support.servers import TOOLS

SPARK_LINE: Final = "4.1"
"""The Spark line the jars are built for; PySpark must be on it."""

JARS_DIR: Final = TOOLS / "spark-jars"

JARS: Final = {
    f"iceberg-spark-runtime-{SPARK_LINE}_2.13-": "Iceberg's Spark runtime",
    "sqlite-jdbc-": "the JDBC driver of Iceberg's JdbcCatalog on Icefloe's SQLite catalog file",
    "iceberg-aws-bundle-": "Iceberg's S3FileIO and the AWS SDK v2",
    f"delta-spark_{SPARK_LINE}_2.13-": "Delta Lake for Spark",
    "delta-storage-": "Delta's log stores",
    "hadoop-aws-": "S3A, the Hadoop file system Delta reads s3:// through",
    "apache-client-": "the AWS SDK's HTTP client S3A uses",
    "s3-transfer-manager-": "the AWS SDK's transfer manager S3A uses",
}
"""Each jar the reader needs, by file-name prefix (the versions are pinned in the script)."""

CATALOG_NAME: Final = "icefloe"
"""``[table.iceberg] name``'s default. Iceberg's JdbcCatalog keys its rows by its own name, so
the Spark catalog takes the name of the Icefloe catalog it reads."""

READ_TIMEOUT_S: Final = 240.0


def spark_jars() -> list[Path]:
    """The jars of :data:`JARS`, or a clear error naming the install script."""
    found = sorted(JARS_DIR.glob("*.jar"))
    jars = []
    for prefix, purpose in JARS.items():
        matches = [jar for jar in found if jar.name.startswith(prefix)]
        if len(matches) != 1:
            state = "missing" if not matches else f"there {len(matches)} times"
            raise RuntimeError(
                f"{prefix}*.jar ({purpose}) is {state} in {JARS_DIR}: run scripts/install-servers"
            )
        jars.append(matches[0])
    return jars


def spark_conf(jars: list[Path]) -> dict[str, str]:
    """A small, quiet, loopback-only local Spark with the Iceberg and Delta extensions."""
    return {
        "spark.master": "local[1]",
        "spark.app.name": "icefloe-table-reader",
        "spark.jars": ",".join(str(jar) for jar in jars),
        "spark.driver.memory": "512m",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        # A short-lived JVM starts faster with the client compiler and the serial collector.
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "WARN",
        # A few hundred rows: one partition wherever Spark or Delta would make 50 or 200.
        "spark.sql.shuffle.partitions": "1",
        "spark.databricks.delta.snapshotPartitions": "1",
        "spark.sql.extensions": (
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions,"
            "io.delta.sql.DeltaSparkSessionExtension"
        ),
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }


def iceberg_catalog_conf(
    catalog_file: Path,
    warehouse: str,
    iceberg_properties: Mapping[str, str],
    name: str = CATALOG_NAME,
) -> dict[str, str]:
    """Spark settings of an Iceberg catalog ``name`` over Icefloe's SQLite catalog file."""
    properties = {
        "type": "jdbc",
        "uri": f"jdbc:sqlite:{catalog_file}",
        "warehouse": warehouse,
        "jdbc.init-catalog-tables": "false",  # read only: never create the catalog's tables
        "io-impl": "org.apache.iceberg.io.ResolvingFileIO",  # S3FileIO for s3://, Hadoop else
    }
    properties.update(iceberg_properties)
    prefix = f"spark.sql.catalog.{name}"
    return {prefix: "org.apache.iceberg.spark.SparkCatalog"} | {
        f"{prefix}.{key}": value for key, value in properties.items()
    }


def delta_options(engine_options: Mapping[str, str]) -> dict[str, str]:
    """Hadoop settings (S3A) for the store ``engine_options`` (object_store vocabulary) reach,
    as options of a Delta read; nothing for the local file system."""
    if not engine_options:
        return {}
    if not all(key.startswith("aws_") for key in engine_options):
        raise ValueError(f"no Spark settings for these engine options: {sorted(engine_options)}")
    names = {
        "aws_endpoint": "fs.s3a.endpoint",
        "aws_region": "fs.s3a.endpoint.region",
        "aws_access_key_id": "fs.s3a.access.key",
        "aws_secret_access_key": "fs.s3a.secret.key",
        "aws_session_token": "fs.s3a.session.token",
    }
    options = {
        # Icefloe's tables are s3:// URLs; S3A serves them as it serves s3a://.
        "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        # Hadoop caches a file system per scheme and bucket, whatever its endpoint: each read
        # gets its own, as two test servers may serve buckets of the same name.
        "fs.s3.impl.disable.cache": "true",
        "fs.s3a.impl.disable.cache": "true",
    }
    for key, value in engine_options.items():
        if key in names:
            options[names[key]] = value
        elif key == "aws_virtual_hosted_style_request":
            options["fs.s3a.path.style.access"] = str(value.lower() != "true").lower()
    if "aws_session_token" in engine_options:
        options["fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        )
    return options


class SparkReader:
    """Reads tables with Spark in a process of its own; Spark starts as soon as this is made
    (it takes seconds), so it boots while the caller does other work."""

    def __init__(self) -> None:
        if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
            raise RuntimeError("Spark needs Java 17 or later on PATH (or JAVA_HOME)")
        import pyspark

        if not pyspark.__version__.startswith(f"{SPARK_LINE}."):
            raise RuntimeError(
                f"the jars in {JARS_DIR} are for Spark {SPARK_LINE}, PySpark is "
                f"{pyspark.__version__}: update scripts/servers.d/spark-jars.sh"
            )
        conf = spark_conf(spark_jars())
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        self._started: Future[str] = self._pool.submit(_start, conf)

    @property
    def version(self) -> str:
        """The running Spark's version."""
        return self._started.result(READ_TIMEOUT_S)

    def iceberg_rows(
        self,
        identifier: str,
        catalog_file: Path,
        warehouse: str,
        iceberg_properties: Mapping[str, str],
        catalog: str = CATALOG_NAME,
    ) -> list[Row]:
        """The Iceberg table ``identifier`` through the SQL catalog in ``catalog_file``."""
        conf = iceberg_catalog_conf(catalog_file, warehouse, iceberg_properties, catalog)
        return self._run(_iceberg_rows, conf, f"{catalog}.{identifier}")

    def delta_rows(self, location: str, engine_options: Mapping[str, str]) -> list[Row]:
        """The Delta table at ``location``."""
        return self._run(_delta_rows, location, delta_options(engine_options))

    def iceberg_selected(
        self,
        identifier: str,
        catalog_file: Path,
        warehouse: str,
        iceberg_properties: Mapping[str, str],
        expressions: list[str],
    ) -> list[dict[str, Any]]:
        """Spark SQL ``expressions`` over the Iceberg table ``identifier``, by offset."""
        conf = iceberg_catalog_conf(catalog_file, warehouse, iceberg_properties, CATALOG_NAME)
        quoted = ".".join(f"`{part}`" for part in (CATALOG_NAME, *identifier.split(".")))
        return self._run(_iceberg_selected, conf, quoted, expressions)

    def delta_selected(self, location: str, expressions: list[str]) -> list[dict[str, Any]]:
        """Spark SQL ``expressions`` over the Delta table at ``location`` (local), by offset."""
        return self._run(_delta_selected, location, expressions)

    def close(self) -> None:
        """Stop Spark and its process."""
        try:
            if self._started.done() and self._started.exception() is None:
                self._pool.submit(_stop).result(60)
        finally:
            self._pool.shutdown(cancel_futures=True)

    def _run(self, function: Any, *args: Any) -> Any:
        self._started.result(READ_TIMEOUT_S)  # raises the start's error, if any
        return self._pool.submit(function, *args).result(READ_TIMEOUT_S)


# --- in the Spark process ---------------------------------------------------------------

_session: Any = None


def _start(conf: dict[str, str]) -> str:
    global _session
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # this process only: no host-name lookup
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        _session = builder.getOrCreate()
        _session.range(1).toArrow()  # Spark's first job is slow: not inside the first read
    except Exception as exc:  # PySpark raises several unrelated types
        raise RuntimeError(f"Spark did not start: {exc}") from exc
    return str(_session.version)


def _iceberg_rows(conf: dict[str, str], table: str) -> list[Row]:
    with _reading(f"Spark reading Iceberg table {table}"):
        session = _session.newSession()
        for key, value in conf.items():
            session.conf.set(key, value)
        return _selected(session.table(table))


def _delta_rows(location: str, options: dict[str, str]) -> list[Row]:
    with _reading(f"Spark reading Delta table {location}"):
        reader = _session.newSession().read.format("delta").options(**options)
        return _selected(reader.load(location))


def _iceberg_selected(
    conf: dict[str, str], table: str, expressions: list[str]
) -> list[dict[str, Any]]:
    with _reading(f"Spark reading Iceberg table {table}"):
        session = _session.newSession()
        for key, value in conf.items():
            session.conf.set(key, value)
        frame = session.table(table).orderBy("offset").selectExpr(*expressions)
        return list(frame.toArrow().to_pylist())


def _delta_selected(location: str, expressions: list[str]) -> list[dict[str, Any]]:
    with _reading(f"Spark reading Delta table {location}"):
        frame = _session.newSession().read.format("delta").load(location)
        return list(frame.orderBy("offset").selectExpr(*expressions).toArrow().to_pylist())


def _selected(frame: Any) -> list[Row]:
    return rows_of(frame.select("partition", "offset", "key", "value").toArrow())


@contextlib.contextmanager
def _reading(what: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:  # PySpark raises several unrelated types
        raise RuntimeError(f"{what}: {exc}") from exc


def _stop() -> None:
    global _session
    if _session is not None:
        _session.stop()
        _session = None
