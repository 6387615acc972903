"""The example services' entry points that docker-compose.yml runs, against a real database."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from examples.orders_service.__main__ import main as orders_main
from examples.shipping_service.__main__ import main as shipping_main
from outbox.testing.plugin import DatabaseFactory


def test_orders_service_places_orders_and_declines_every_fourth(
    outbox_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert orders_main(["--database-url", outbox_database_url, "--count", "8", "--every", "0"]) == 0
    with psycopg.connect(outbox_database_url) as conn:
        orders = conn.execute("SELECT count(*) FROM orders").fetchone()
        messages = conn.execute("SELECT count(*) FROM outbox.producer_queue").fetchone()
    assert orders == messages == (6,)
    assert capsys.readouterr().out.count("payment declined, rolled back") == 2


def test_shipping_service_creates_its_table_and_reports(
    outbox_database_factory: DatabaseFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = outbox_database_factory(migrated=False)
    ready = tmp_path / "ready"
    assert shipping_main(["--database-url", url, "--ready-file", str(ready), "--once"]) == 0
    assert ready.exists()
    assert "shipments: 0, latest for order None" in capsys.readouterr().out
