"""docs/other-languages.md: its Node example sends in its own transaction with `outbox.send` and
a Python handler handles what committed, once; a rolled-back send is never seen.

Node runs the page's own ```js block with node-postgres (`pg`), which `./run test` installs in
.cache/node-pg (or OUTBOX_NODE_PG_DIR). Without node and npm the test is skipped, saying so; with
them but without `pg` it fails, saying how to install it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox import Handlers, InboxMessage
from outbox.testing.plugin import Drain

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "other-languages.md"
JS_BLOCK = re.compile(r"^```js\n(.*?)^```", re.M | re.S)

#: Runs the page's module: one order committed, one whose transaction fails, one refused send.
DRIVER = """
const { Client, placeOrder } = require("./place_order.js");

(async () => {
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  const result = {};
  result.sent = await placeOrder(client, { id: 1, total: "12.50" });
  try {
    await placeOrder(client, { id: 2, total: "99.00" }, { fail: true });
  } catch (err) {
    result.failed = err.message;
  }
  try {
    await client.query("SELECT outbox.send('bad topic', $1::jsonb)", ["{}"]);
  } catch (err) {
    result.refused = { code: err.code, detail: err.detail, message: err.message };
  }
  await client.end();
  console.log(JSON.stringify(result));
})().catch((err) => {
  console.error(err);
  process.exit(1);
});
"""


def node_pg_dir() -> Path:
    """Where node-postgres is installed (its node_modules), or the test is skipped or fails."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the Node example is not run")
    base = Path(os.environ.get("OUTBOX_NODE_PG_DIR") or ROOT / ".cache" / "node-pg")
    modules = base / "node_modules"
    if not (modules / "pg").is_dir():
        pytest.fail(
            f"node-postgres is not installed in {base}: run ./run test (which installs it) or "
            "`npm install --prefix .cache/node-pg pg@8.13.1`"
        )
    return modules


def test_the_node_example_sends_in_its_transaction_and_python_handles_it_once(
    outbox_database_url: str, outbox_log_url: str, outbox_drain: Drain, tmp_path: Path
) -> None:
    modules = node_pg_dir()
    url = outbox_database_url
    (module,) = JS_BLOCK.findall(PAGE.read_text())
    (tmp_path / "place_order.js").write_text(module)
    (tmp_path / "driver.js").write_text(DRIVER)
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total numeric NOT NULL)")
    run = subprocess.run(
        ["node", "driver.js"],
        cwd=tmp_path,
        env={**os.environ, "DATABASE_URL": url, "NODE_PATH": str(modules)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["failed"] == "payment refused"
    assert result["refused"]["code"] == "22023"
    assert result["refused"]["detail"] == "InvalidTopic"
    assert "topic 'bad topic' contains ' '" in result["refused"]["message"]
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT id FROM orders").fetchall() == [(1,)]

    handled: list[InboxMessage[Any]] = []
    handlers = Handlers()

    @handlers.handler("orders.placed")
    def record(message: InboxMessage[Any], conn: Any) -> None:
        handled.append(message)

    outbox_drain(handlers, transport=outbox_log_url)
    outbox_drain(handlers, transport=outbox_log_url)  # nothing more, nothing twice
    assert [(str(m.id), m.key, m.payload, m.headers.get("x-origin")) for m in handled] == [
        (result["sent"], b"1", {"id": 1, "total": "12.50"}, "node")
    ]
