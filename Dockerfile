# The image docker-compose.yml runs: the `outbox` command and the example services.
# Build: docker build -t pg-kafka-outbox .   Run: docker run --rm pg-kafka-outbox outbox --help
FROM python:3.12-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The package first, so that editing the examples does not reinstall it. EXTRAS adds optional
# parts, e.g. --build-arg EXTRAS=sqlalchemy,metrics for --metrics-port.
ARG EXTRAS=sqlalchemy
COPY pyproject.toml README.md ./
COPY outbox ./outbox
COPY migrations ./migrations
RUN pip install ".[${EXTRAS}]"

# The example services are imported from the working directory (`outbox handler` puts it on
# sys.path), as a service's own code would be.
COPY examples ./examples

USER nobody
CMD ["outbox", "--help"]
