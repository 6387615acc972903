"""The floor of `outbox serve`'s publish: the same stack (FastAPI on uvicorn, the body read into
the same model, outbox.http's connection pool, a worker thread per request) with one bare
INSERT of the request's rows in place of `Broker.send_many`. Run by benchmarks.serve_http:
`uvicorn benchmarks.http_floor_app:app` with BENCH_HTTP_FLOOR_URL set."""

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI

from outbox.http.app import MessageIn
from outbox.http.pool import Pool

URL = os.environ.get("BENCH_HTTP_FLOOR_URL", "")
SETUP = "CREATE TABLE IF NOT EXISTS bare (id bigserial PRIMARY KEY, key text, payload bytea)"
INSERT = "INSERT INTO bare (key, payload) SELECT * FROM unnest(%s::text[], %s::bytea[])"

pool = Pool(URL, 8, "bench-floor")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    with pool.connection() as conn:
        conn.execute(SETUP)
    yield
    pool.close()


app = FastAPI(lifespan=lifespan)


@app.get("/livez")
async def livez() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/bare", status_code=201)
async def bare(body: MessageIn | list[MessageIn]) -> dict[str, Any]:
    items = body if isinstance(body, list) else [body]

    def write() -> None:
        with pool.connection() as conn, conn.transaction():
            conn.execute(
                INSERT,
                ([m.key for m in items], [json.dumps(m.payload).encode() for m in items]),
            )

    await anyio.to_thread.run_sync(write)
    return {"rows": len(items)}
