"""What retrying can fix: the one classification every daemon loop uses (decision 15).

Contract: `retriable(exc)` is True only for a failure that the same work can get past by
waiting and trying again: a lost or refused database connection, a server error that says
"later" (a serialization failure, a deadlock, a lock or statement timeout, a server shutting
down or starting, too many connections, no resources), an unreachable database or broker, and
a Kafka error librdkafka itself calls retriable. Everything else (a missing module or extra, a
configuration error, a schema not migrated, a missing privilege or table, a programming error)
is False: a daemon loop does not retry it, it stops the daemon with one line.

Pure code: drivers are recognized by what PEP 249 and the libraries expose (`sqlstate` or
`pgcode`, the DB-API class names, SQLAlchemy's `orig`, KafkaError's `retriable()`), so that
this module imports no driver.
"""

from __future__ import annotations

from outbox.core.errors import DatabaseUnavailable, KafkaUnavailable

__all__ = [
    "RETRIABLE_SQLSTATES",
    "database_error",
    "refused_for_data",
    "retriable",
    "sqlstate",
]

#: SQLSTATE classes (two characters) and codes that retrying can fix.
RETRIABLE_SQLSTATES = frozenset(
    {
        "08",  # connection_exception: the connection failed or was lost
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "40003",  # statement_completion_unknown
        "53",  # insufficient_resources: disk full, out of memory, too many connections
        "55P03",  # lock_not_available (lock_timeout)
        "57014",  # query_canceled (statement_timeout, pg_cancel_backend)
        "57P01",  # admin_shutdown (pg_terminate_backend, a fast shutdown)
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (the server is starting)
        "57P05",  # idle_session_timeout
        "58000",  # system_error
        "58030",  # io_error
        "25006",  # read_only_sql_transaction: a standby, until a failover promotes it
        "25P03",  # idle_in_transaction_session_timeout: the session is gone, a new one works
        "25P04",  # transaction_timeout (PostgreSQL 17): the same, for a whole transaction
        "55006",  # object_in_use: another session holds what the statement needs, for now
    }
)

#: PEP 249 names of the errors that mean "the connection failed or was lost" when they carry
#: no SQLSTATE (the client gave up, not the server).
_CONNECTION_ERRORS = frozenset({"OperationalError", "DisconnectionError"})


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error (psycopg's `sqlstate`, psycopg2's `pgcode`), or None."""
    for name in ("sqlstate", "pgcode"):
        code = getattr(exc, name, None)
        if isinstance(code, str) and len(code) == 5:
            return code
    return None


def _sqlstate_retriable(code: str) -> bool:
    return code in RETRIABLE_SQLSTATES or code[:2] in RETRIABLE_SQLSTATES


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc`, then the driver errors it wraps (SQLAlchemy's `orig`). Not `__cause__`: a
    wrapper raised from a lost connection is its own error, which says what it is."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen) and len(seen) < 8:
        seen.append(current)
        wrapped = getattr(current, "orig", None)
        current = wrapped if isinstance(wrapped, BaseException) else None
    return seen


def _kafka_retriable(exc: BaseException) -> bool | None:
    """For a KafkaException carrying a KafkaError: whether librdkafka calls it retriable (and
    not fatal); None for anything else."""
    error = exc.args[0] if exc.args else None
    retriable_of = getattr(error, "retriable", None)
    fatal_of = getattr(error, "fatal", None)
    if "KafkaException" not in _names(exc) or not callable(retriable_of):
        return None
    return bool(retriable_of()) and not (callable(fatal_of) and fatal_of())


def retriable(exc: BaseException) -> bool:
    """Whether retrying the work that raised `exc` can succeed (see the module)."""
    for error in _chain(exc):
        if isinstance(error, DatabaseUnavailable | KafkaUnavailable | ConnectionError):
            return True
        code = sqlstate(error)
        if code is not None:
            return _sqlstate_retriable(code)  # the server said what it was: that decides
        kafka = _kafka_retriable(error)
        if kafka is not None:
            return kafka
        names = _names(error)
        if names & _CONNECTION_ERRORS:
            if getattr(error, "orig", None) is not None:
                continue  # SQLAlchemy's wrapper: the driver's error decides
            return True
        if "InterfaceError" in names and "closed" in str(error):
            return True  # a connection lost earlier, used again
    return False


#: SQLSTATE classes that say "this data": data_exception, integrity_constraint_violation,
#: program_limit_exceeded (a value too large for an index row, say).
DATA_SQLSTATES = frozenset({"22", "23", "54"})


def refused_for_data(exc: BaseException) -> bool:
    """Whether the database (or its driver, binding the values) refused a statement for the
    data of a record, so that storing the record apart (a quarantine) can help; not for the
    database's state or the role's rights. A SQLSTATE of class 22, 23 or 54 decides; without
    one, a text that cannot be encoded, or a PEP 249 `DataError` or `IntegrityError` (a driver
    refusing a value it cannot send, such as a NUL byte in text)."""
    for error in _chain(exc):
        code = sqlstate(error)
        if code is not None:
            return code[:2] in DATA_SQLSTATES
        if isinstance(error, UnicodeError) or _names(error) & {"DataError", "IntegrityError"}:
            return True
    return False


def database_error(exc: BaseException) -> bool:
    """Whether `exc` is a database's (or its driver's) error: one carrying a SQLSTATE, or a
    PEP 249 error (every driver's errors derive from a class called `Error`)."""
    return any(sqlstate(e) is not None or "Error" in _names(e) for e in _chain(exc))
