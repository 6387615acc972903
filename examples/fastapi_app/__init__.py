"""A FastAPI service whose relay, consumer and handler run inside the web process (lifespan)."""
