"""The handlers of a service with a database per tenant, run by
`outbox handler tests.faults.tenants_app:handlers` over many databases.

The topic comes from TENANTS_APP_TOPIC. A handled message inserts one row into `effects` of the
database it was handled in, in the handler's transaction; `effects` has no unique constraint, so
a message handled twice shows as two rows, and the payload names the tenant it was sent for, so
a message handled in another tenant's database shows too.
"""

from __future__ import annotations

import os
from typing import Any

from outbox import Handlers, InboxMessage

TOPIC = os.environ.get("TENANTS_APP_TOPIC", "tenants.app")
handlers = Handlers()

SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    n bigserial PRIMARY KEY, message_id uuid NOT NULL, tenant text NOT NULL, key text NOT NULL,
    seq int NOT NULL
);
"""


@handlers.handler(TOPIC)
def record(message: InboxMessage, conn: Any) -> None:
    body = message.payload
    conn.execute(
        "INSERT INTO effects (message_id, tenant, key, seq) VALUES (%s, %s, %s, %s)",
        (message.id, body["tenant"], body["key"], body["seq"]),
    )
