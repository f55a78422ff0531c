from __future__ import annotations

from typing import Any

import pytest

from support import TEST_JVM_OPTIONS


@pytest.fixture(scope="session")
def spark() -> Any:
    """One real local Spark session (2 cores) for the whole run; the CLI reuses it."""
    from rmqstore.spark import SparkUnavailable, spark_session

    try:
        session = spark_session("local[2]", {"spark.driver.extraJavaOptions": TEST_JVM_OPTIONS})
    except SparkUnavailable as exc:  # make test checks Java first; this is a real failure
        pytest.fail(str(exc))
    yield session
    session.stop()
