"""The SparkSession of the outbox jobs: master, small defaults, the Kafka source registered."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Mapping

from pyspark.sql import SparkSession

from outbox.spark.source import register

#: Set by spark-submit (and pyspark's shell) for the Python driver it starts.
SUBMITTED = "PYSPARK_GATEWAY_PORT"
#: Settings that suit a job whose data is a few Kafka partitions, not a warehouse.
DEFAULTS = {
    # The jobs shuffle little (counts, small aggregates): Spark's 200 would be 200 tiny tasks.
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    # Arrow between the JVM and the Python workers (mapInArrow, toPandas).
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


def spark_session(
    master: str | None = None,
    app_name: str = "outbox",
    *,
    ui: bool = True,
    config: Mapping[str, str] | None = None,
) -> SparkSession:
    """Get or create the session, with the `outbox_kafka` source registered.

    `master=None`: the master `spark-submit` was given, or `local[*]` outside spark-submit.
    On a local master, Python workers run this interpreter unless PYSPARK_PYTHON says
    otherwise; on a cluster, set it (or spark.pyspark.python) to the executors' Python.
    `config` entries override DEFAULTS.
    """
    # PySpark 4.x warns on every Arrow call that it does not yet fully support pandas 3;
    # the jobs use Arrow, not pandas, so the warning says nothing about them.
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )
    # py4j logs every call from the JVM (foreachBatch) at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if master is None and SUBMITTED not in os.environ:
        master = "local[*]"
    if master and master.startswith("local"):
        # Workers on this machine: this interpreter, with outbox and its dependencies.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings = {**DEFAULTS, "spark.ui.enabled": "true" if ui else "false", **(config or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def session_running() -> bool:
    """Whether this process already has a SparkContext (a job then leaves it running)."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None
