"""Masking of secrets: URLs, key=value strings, librdkafka settings, log lines."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from outbox.observability.logs import JsonFormatter, RedactingFormatter, configure_logging
from outbox.observability.redact import (
    MASK,
    UNPARSEABLE,
    UNPARSEABLE_NOTE,
    forget_secrets,
    is_secret_key,
    redact_settings,
    redact_text,
    redact_url,
    remember_secrets,
    secrets_of_settings,
    secrets_of_url,
)


@pytest.fixture(autouse=True)
def _no_remembered_secrets() -> Iterator[None]:
    forget_secrets()
    yield
    forget_secrets()


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        (
            "postgresql://app:s3cret@db:5432/app",
            "host=db port=5432 user=app password=*** dbname=app",
        ),
        ("postgresql+psycopg://app:s3cret@db/app", "host=db user=app password=*** dbname=app"),
        # libpq ends the user info at the first "@": the password is "p", the host "ss@db".
        ("postgresql://app:p@ss@db/app", "host=ss@db user=app password=*** dbname=app"),
        ("postgresql://:s3cret@db/app", "host=db password=*** dbname=app"),
        ("postgresql://db/app?user=u&password=s3cret", "host=db user=u password=*** dbname=app"),
        ("host=db user=app password=s3cret dbname=app", "host=db user=app password=*** dbname=app"),
        ("host=db password='s3 cret' dbname=app", "host=db password=*** dbname=app"),
        ("host=db sslpassword=s3cret", "host=db sslpassword=***"),
        # Nothing secret: the parameters as libpq reads them.
        ("postgresql://app@db:5432/app", "host=db port=5432 user=app dbname=app"),
        ("postgresql://db:5432/app?options=a@b", "host=db port=5432 dbname=app options=a@b"),
        # libpq cannot parse these: a URL's user info masked to its last "@", a secret query
        # parameter to the end; a keyword string never shown, whatever it holds.
        (
            "postgresql://db/app?user=u&password=s3cret&x=1",
            f"postgresql://db/app?user=u&password=*** {UNPARSEABLE_NOTE}",
        ),
        ("postgresql://app:pa%zzword@db/app", f"postgresql://app:***@db/app {UNPARSEABLE_NOTE}"),
        (
            "postgresql://app:pa ss/w@rd@127.0.0.1:5999/db",
            f"postgresql://app:***@127.0.0.1:5999/db {UNPARSEABLE_NOTE}",
        ),
        (
            "postgresql://db/app?password=s3 cr&et&x=1",
            f"postgresql://db/app?password=*** {UNPARSEABLE_NOTE}",
        ),
        ("host=db password='s3cret", UNPARSEABLE),
        ("host=db password=a b c", UNPARSEABLE),
    ],
)
def test_redact_url_parses_with_libpq_and_masks_only_the_password(url: str, masked: str) -> None:
    assert redact_url(url) == masked


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("postgresql://app:s3cret@db:5432/app", "postgresql://app:***@db:5432/app"),
        ("postgresql+psycopg://app:s3cret@db/app", "postgresql+psycopg://app:***@db/app"),
        ("postgresql://app:p@ss@db/app", "postgresql://app:***@db/app"),
        ("postgresql://app:it's\"x@db/app", "postgresql://app:***@db/app"),
        (
            "postgresql://db/app?user=u&password=s3cret&x=1",
            "postgresql://db/app?user=u&password=***&x=1",
        ),
        ("host=db password='s3 \\'cret' dbname=app", "host=db password=*** dbname=app"),
        ("host=db password=s3\\ cr;e&t,x dbname=app", "host=db password=*** dbname=app"),
        ("postgresql://app@db:5432/app", "postgresql://app@db:5432/app"),
    ],
)
def test_redact_text_masks_passwords_in_every_form(text: str, masked: str) -> None:
    assert redact_text(text) == masked


def test_redact_text_masks_urls_and_secret_assignments_inside_messages() -> None:
    text = (
        'missing "=" after "postgresq://app:hunter2@db/x" in connection info string; '
        'sasl.password=kafka-pw ssl.key.password="k p" sasl.username=bob'
    )
    masked = redact_text(text)
    assert "hunter2" not in masked and "kafka-pw" not in masked and "k p" not in masked
    # A libpq parse error: from its first quoted piece to the last quote of the line.
    assert masked.startswith('missing "=" after "***"')
    assert "sasl.username=bob" in masked
    assert redact_text('password authentication failed for user "app"') == (
        'password authentication failed for user "app"'
    )


def test_remembered_secrets_are_masked_wherever_they_appear() -> None:
    text = 'the server said "pa%zzword" here'
    assert redact_text(text) == text  # no pattern recognises it
    remember_secrets(secrets_of_url("postgresql://app:pa%zzword@db/app"))
    assert redact_text(text) == f'the server said "{MASK}" here'


def test_short_secrets_are_not_remembered() -> None:
    remember_secrets({"ab"})
    assert redact_text("abc cab") == "abc cab"


def test_secrets_of_url_finds_raw_and_decoded_passwords() -> None:
    assert {"p%40ss%2Fword", "p@ss/word"} <= secrets_of_url("postgresql://app:p%40ss%2Fword@db/app")
    assert {"s3 cret", "'s3 cret'", "s3%20cret"} <= secrets_of_url("host=db password='s3 cret'")
    assert {"it's", "it\\'s"} <= secrets_of_url("host=db password='it\\'s'")
    assert secrets_of_url("postgresql://app@db/app") == set()


@pytest.mark.parametrize(
    "key",
    [
        "sasl.password",
        "sasl.oauthbearer.client.secret",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
        "sasl.oauthbearer.config",
        "SASL.PASSWORD",
        "my.custom.secret.thing",
    ],
)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["sasl.username", "acks", "bootstrap.servers", "ssl.ca.location"])
def test_ordinary_keys(key: str) -> None:
    assert not is_secret_key(key)


def test_redact_settings_masks_secret_values_and_urls() -> None:
    settings = {
        "sasl.password": "pw1",
        "sasl.oauthbearer.client.secret": "pw2",
        "sasl.username": "bob",
        "sasl.oauthbearer.token.endpoint.url": "https://id:pw3@idp/token",
        "plugin.library.paths": "https://id:pw4@plugins/x",  # no secret word: the URL redacted
        "linger.ms": 5,
    }
    assert redact_settings(settings) == {
        "sasl.password": MASK,
        "sasl.oauthbearer.client.secret": MASK,
        "sasl.username": "bob",
        "sasl.oauthbearer.token.endpoint.url": MASK,  # "token" in its name: masked whole
        "plugin.library.paths": "https://id:***@plugins/x",
        "linger.ms": 5,
    }
    assert {"pw1", "pw2", "pw3", "pw4"} <= secrets_of_settings(settings)


def _record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("outbox.test", logging.WARNING, __file__, 1, message, args, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_json_lines_carry_extra_fields_and_mask_secrets_everywhere() -> None:
    remember_secrets({"hunter22"})
    record = _record(
        "cannot connect to %s",
        "postgresql://app:hunter22@db/app",
        topic="orders",
        counts={"orders": 3},
        detail="key sasl.password=hunter22",
    )
    entry = json.loads(JsonFormatter().format(record))
    assert entry["level"] == "WARNING" and entry["logger"] == "outbox.test"
    assert entry["timestamp"].endswith("+00:00")
    assert entry["message"] == "cannot connect to postgresql://app:***@db/app"
    assert entry["topic"] == "orders" and entry["counts"] == {"orders": 3}
    assert "hunter22" not in json.dumps(entry)


def test_json_lines_carry_the_traceback_in_one_field() -> None:
    try:
        raise ValueError("bad password=s3cret")
    except ValueError:
        record = logging.LogRecord(
            "outbox",
            logging.ERROR,
            __file__,
            1,
            "failed",
            (),
            exc_info=__import__("sys").exc_info(),
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert "ValueError: bad password=***" in entry["exception"]


def test_text_format_masks_secrets() -> None:
    remember_secrets({"hunter22"})
    line = RedactingFormatter("%(message)s").format(_record("pw is hunter22"))
    assert line == "pw is ***"


def test_text_format_escapes_control_characters_and_keeps_a_message_on_one_line() -> None:
    """An exception's text reaches the log from outside (a callback raising with a payload's
    text): escape sequences, a carriage return or a line break in it must not recolour the
    terminal, set its title or forge a log line."""
    hostile = "\x1b[2J\x1b[31mRED\x1b]0;title\x07\rFAKE LINE\nsecond"
    line = RedactingFormatter("%(levelname)s %(message)s").format(_record(hostile))
    assert line == "WARNING \\x1b[2J\\x1b[31mRED\\x1b]0;title\\x07\\rFAKE LINE\\nsecond"
    assert "\n" not in line and "\x1b" not in line
    try:
        raise ValueError("boom\x1b[31m\rX")
    except ValueError:
        import sys

        record = logging.makeLogRecord({"msg": "failed", "exc_info": sys.exc_info()})
    text = RedactingFormatter("%(message)s").format(record)
    assert text.startswith("failed\nTraceback (most recent call last):\n")
    assert text.endswith("ValueError: boom\\x1b[31m\\rX")
    assert text.replace("\n", "").isprintable()


def test_configure_logging_writes_json_lines_at_the_level_asked() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("warning", "json", stream)
        logging.getLogger("outbox.test").info("not shown")
        logging.getLogger("outbox.test").warning("shown", extra={"topic": "t"})
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["topic"] == "t"


# -- every password libpq accepts, in URL and keyword form ---------------------------------------

#: Printable ASCII (space, quotes and backslash included) and some non-ASCII characters; NUL is
#: the one character a libpq connection string cannot carry.
PASSWORD_CHARACTERS = [chr(c) for c in range(0x20, 0x7F)] + list("éü߀密码🙂\u00a0")
#: Around every generated password, so that even a one-character password is recognisable and
#: a partial leak (the start or the end of it) is caught.
LEFT, RIGHT = "QzXl", "QzXr"
MARKER = "QzX"


def url_form(password: str) -> str:
    """A URL carrying `password`, percent-encoded as libpq needs."""
    from urllib.parse import quote

    return f"postgresql://app:{quote(password, safe='')}@127.0.0.1:1/app?connect_timeout=1"


def keyword_form(password: str) -> str:
    """A keyword connection string carrying `password`, quoted and escaped as libpq needs."""
    escaped = password.replace("\\", "\\\\").replace("'", "\\'")
    return f"host=127.0.0.1 port=1 user=app password='{escaped}' dbname=app connect_timeout=1"


def raw_url_form(password: str) -> str:
    """A URL with only what libpq needs percent-encoded (space % / @)."""
    encoded = "".join(f"%{ord(c):02X}" if c in " %/@" else c for c in password)
    return f"postgresql://app:{encoded}@127.0.0.1:1/app"


def unquoted_keyword_form(password: str) -> str:
    """An unquoted keyword value, only space and backslash escaped."""
    escaped = password.replace("\\", "\\\\").replace(" ", "\\ ")
    return f"host=127.0.0.1 port=1 user=app password={escaped} dbname=app"


FORMS = [url_form, raw_url_form, keyword_form, unquoted_keyword_form]


def carried(conninfo: str) -> str:
    """The password libpq reads from `conninfo`."""
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(conninfo)["password"])


def test_every_character_libpq_accepts_in_one_password() -> None:
    password = LEFT + "".join(PASSWORD_CHARACTERS) + RIGHT
    for conninfo in [form(password) for form in FORMS]:
        assert carried(conninfo) == password
        assert MARKER not in redact_url(conninfo)
        assert MARKER not in redact_text(conninfo)
        assert MARKER not in redact_text(f'cannot connect: "{conninfo}" refused')
        remember_secrets(secrets_of_url(conninfo))
        for written in (password, *[form(password) for form in FORMS]):
            assert MARKER not in redact_text(f"x {written} y")
        forget_secrets()


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass
else:
    passwords = st.text(alphabet=st.sampled_from(PASSWORD_CHARACTERS), max_size=24).map(
        lambda middle: LEFT + middle + RIGHT
    )

    @settings(max_examples=150, deadline=None)
    @given(password=passwords, form=st.sampled_from(FORMS))
    def test_generated_passwords_never_survive_the_maskers(password: str, form: Any) -> None:
        forget_secrets()
        conninfo = form(password)
        assert carried(conninfo) == password  # the test string really carries it
        # The parsed masker (the startup line), and the patterns alone (no remembered secret).
        assert MARKER not in redact_url(conninfo)
        assert MARKER not in redact_text(conninfo)
        assert MARKER not in redact_text(f'missing "=" after "{conninfo}" in connection info')
        # The remembered forms: the password as written, as libpq parsed it, and as quoted,
        # also inside text escaped again (a repr or JSON of the whole string).
        remember_secrets(secrets_of_url(conninfo))
        for text in (password, repr(password), json.dumps(password), form(password)):
            assert MARKER not in redact_text(f"said {text} here")
        assert MARKER not in redact_text(f"error near {conninfo!r}: bad")
        assert MARKER not in redact_text(json.dumps({"url": conninfo}))
        forget_secrets()

    @settings(max_examples=60, deadline=None)
    @given(password=passwords, form=st.sampled_from(FORMS))
    def test_generated_passwords_never_reach_the_startup_line(password: str, form: Any) -> None:
        from outbox.core.databases import Database
        from outbox.daemons.producer import ProducerConfig
        from outbox.observability.health import Heartbeat
        from outbox.observability.runtime import Observability, Observer

        forget_secrets()
        observability = Observability(
            "producer",
            Observer(shown={"transport": "kafka", "kafka_bootstrap": "127.0.0.1:9"}),
            tuning=ProducerConfig(),
            heartbeat=Heartbeat(),
            relay_id="test-relay",
            database=Database("app", form(password), "outbox"),
        )
        forget_secrets()  # the parsed masker alone must hide it
        for formatter in (JsonFormatter(), RedactingFormatter("%(message)s")):
            stream = io.StringIO()
            handler = logging.StreamHandler(stream)
            handler.setFormatter(formatter)
            log = logging.getLogger("outbox.producer")
            log.addHandler(handler)
            saved = log.level
            log.setLevel(logging.INFO)
            try:
                observability._log_startup()
            finally:
                log.removeHandler(handler)
                log.setLevel(saved)
            line = stream.getvalue()
            assert "producer starting" in line and MARKER not in line, line
