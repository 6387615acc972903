"""Where the user's librdkafka settings come from: a properties file, the environment, flags.

Contract: every librdkafka setting can be given without a command line (where `ps` and
/proc/PID/cmdline show it to every user of the host):

- a properties file named by `--kafka-config-file` or OUTBOX_KAFKA_CONFIG_FILE: `key=value`
  lines, blank lines and `#` comments ignored, the key exactly as librdkafka spells it;
- one variable per setting, OUTBOX_KAFKA_CONFIG_<NAME>: NAME is the key upper-cased with its
  dots written as underscores (OUTBOX_KAFKA_CONFIG_SASL_PASSWORD is `sasl.password`).

librdkafka's keys separate words with dots; the only ones with an underscore are its callbacks
and pointers, set through its C API and never from text, and two integers, `log_level` and
`enabled_events`: NAME maps back by turning every underscore into a dot, except those two
names (UNDERSCORED). An empty variable counts as unset.

Precedence, setting by setting: a `--kafka-config` flag beats a variable, which beats the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from outbox import settings
from outbox.core.errors import ConfigurationError

__all__ = [
    "PREFIX",
    "UNDERSCORED",
    "environment_settings",
    "key_of_variable",
    "merged_settings",
    "read_properties",
    "variable_of_key",
]

#: The prefix of the variables that each carry one librdkafka setting.
PREFIX = settings.KAFKA_CONFIG_PREFIX
#: The librdkafka keys settable from text whose name holds an underscore (librdkafka's
#: CONFIGURATION.md; the other underscored keys are callbacks and pointers of its C API).
UNDERSCORED = {"LOG_LEVEL": "log_level", "ENABLED_EVENTS": "enabled_events"}


def key_of_variable(name: str) -> str | None:
    """The librdkafka key a variable sets (`OUTBOX_KAFKA_CONFIG_SASL_PASSWORD`: `sasl.password`),
    or None for a variable that is not one of them (OUTBOX_KAFKA_CONFIG_FILE among them)."""
    if not name.startswith(PREFIX) or name == settings.KAFKA_CONFIG_FILE:
        return None
    suffix = name[len(PREFIX) :].upper()
    if not suffix or suffix.startswith("_") or suffix.endswith("_") or "__" in suffix:
        return None
    return UNDERSCORED.get(suffix, suffix.lower().replace("_", "."))


def variable_of_key(key: str) -> str:
    """The variable that carries librdkafka setting `key` (`sasl.password`:
    `OUTBOX_KAFKA_CONFIG_SASL_PASSWORD`)."""
    return PREFIX + key.upper().replace(".", "_")


def environment_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The librdkafka settings of the OUTBOX_KAFKA_CONFIG_<NAME> variables of `environ`."""
    found: dict[str, str] = {}
    for name in sorted(environ):
        key = key_of_variable(name)
        if key is not None and environ[name].strip():
            found[key] = environ[name].strip()
    return found


def read_properties(path: str) -> dict[str, str]:
    """The settings of a properties file; a file that cannot be read or a line that is not
    `key=value` is a ConfigurationError naming the file and the line (never the line's text,
    which may hold a secret)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigurationError(
            f"cannot read the Kafka settings file {path} (--kafka-config-file or "
            f"{settings.KAFKA_CONFIG_FILE}): {reason}"
        ) from None
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        if not sep or not key.strip() or any(c.isspace() for c in key.strip()):
            raise ConfigurationError(
                f"{path}:{number}: expected a librdkafka setting as key=value, or a # comment "
                "(the line is not shown: it may hold a secret)"
            )
        found[key.strip()] = value.strip()
    return found


def merged_settings(
    flags: Iterable[tuple[str, str]], file: str | None, environ: Mapping[str, str]
) -> list[tuple[str, str]]:
    """The user's librdkafka settings, lowest precedence first: the file's, the variables',
    then the flags' (a later entry replaces an earlier one of the same key in `dict()`)."""
    merged = list((read_properties(file) if file else {}).items())
    merged.extend(environment_settings(environ).items())
    merged.extend(flags)
    return merged
