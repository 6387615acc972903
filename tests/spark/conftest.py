"""Fixtures of the Spark tests: one SparkSession on local[2] for the whole session.

The session is made small and quick to start: no UI, two shuffle partitions. Python workers
run this interpreter (PYSPARK_PYTHON is set by `outbox.spark.session.spark_session`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # PySpark 4.x warns on Arrow calls that it does not yet fully support pandas 3; the
    # jobs use Arrow, not pandas. Other warnings still fail the tests.
    config.addinivalue_line(
        "filterwarnings", "ignore:PySpark does not yet fully support pandas:FutureWarning"
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The tests' SparkSession on local[2], with the `outbox_kafka` source registered."""
    pytest.importorskip("pyspark")
    from outbox.spark.session import spark_session

    session = spark_session(
        "local[2]",
        "outbox-tests",
        ui=False,
        config={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.adaptive.enabled": "false",
            "spark.sql.streaming.minBatchesToRetain": "5",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
