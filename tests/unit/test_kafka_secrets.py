"""Every librdkafka setting that holds a secret is masked: walked from the installed library.

The masking decides by rule (`outbox.core.redact.is_secret_key`: the words of a setting's name),
not by a list of settings, so a setting librdkafka adds later is masked the day it ships. These
tests hold that rule against the library's own table of properties (`tests.librdkafka_properties`),
judged by what each property's description says it holds: a property whose description or name
speaks of a password, passphrase, secret, private key, key material, token, credentials or a
SASL/JAAS configuration must be masked, or be named below with the reason it holds no secret.
"""

from __future__ import annotations

import re

import pytest

from outbox.core.redact import MASK, is_secret_key, redact_settings, secrets_of_settings
from tests.librdkafka_properties import Property, properties

#: What a description (or name) says when the value is, or carries, a secret.
SPEAKS_OF_A_SECRET = re.compile(
    r"password|passphrase|secret|private key|key material|credential|token|jaas|"
    r"\(PEM|PEM format|keystore|keytab|SASL/\w+ configuration|configuration string",
    re.IGNORECASE,
)

#: Properties whose description speaks of a secret but whose value is none: each with why.
HOLDS_NO_SECRET = {
    "ssl.certificate.location": "a path to the client's public certificate",
    "https.ca.location": "a path to CA certificates",
    "sasl.oauthbearer.sub.claim.name": "the name of a JWT claim, not its value",
}

#: Types whose values come from a fixed set or are numbers: never a secret.
NOT_FREE_TEXT = {"boolean", "integer", "float", "enum value", "CSV flags"}


def settable_with_text(prop: Property) -> bool:
    """Whether a `--kafka-config` line can set it: strings, not callbacks or pointers."""
    return prop.type not in NOT_FREE_TEXT and prop.type != "see dedicated API"


def secret_bearing() -> list[Property]:
    return [
        prop
        for prop in properties()
        if settable_with_text(prop)
        and (SPEAKS_OF_A_SECRET.search(prop.description) or SPEAKS_OF_A_SECRET.search(prop.name))
    ]


def test_the_table_is_read_from_the_library() -> None:
    names = {prop.name for prop in properties()}
    # Settings every librdkafka of these years has; the table is the library's, whole.
    assert {"bootstrap.servers", "sasl.password", "ssl.key.pem", "acks"} <= names
    assert len(names) > 150


def test_every_secret_bearing_librdkafka_setting_is_masked() -> None:
    unmasked = [
        f"{prop.name}: {prop.description[:100]}"
        for prop in secret_bearing()
        if not is_secret_key(prop.name) and prop.name not in HOLDS_NO_SECRET
    ]
    assert not unmasked, "secret-bearing settings shown in clear:\n" + "\n".join(unmasked)


def test_the_settings_named_as_holding_no_secret_still_exist_and_still_say_so() -> None:
    """A stale exception would let a renamed or changed property slip through unreviewed."""
    by_name = {prop.name: prop for prop in secret_bearing()}
    assert set(HOLDS_NO_SECRET) <= set(by_name)


@pytest.mark.parametrize(
    "name", [prop.name for prop in secret_bearing() if prop.name not in HOLDS_NO_SECRET]
)
def test_a_secret_setting_s_value_is_masked_and_remembered(name: str) -> None:
    value = f"v4lue-of-{name}"
    assert redact_settings({name: value}) == {name: MASK}
    assert value in secrets_of_settings({name: value})


@pytest.mark.parametrize(
    "name",
    [
        # librdkafka's, from the issue that found them shown in clear.
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.pem",
        # Names a later librdkafka (or a plugin) may well add: masked by rule, before they exist.
        "ssl.client.key.passphrase",
        "sasl.aws.msk.iam.secret.access.key",
        "sasl.oauthbearer.client.assertion.token",
        "ssl.truststore.password",
        "plugin.x.credentials",
        "sasl.gssapi.config",
        "SASL.OAUTHBEARER.ASSERTION.PRIVATE.KEY.PEM",
    ],
)
def test_secret_names_are_masked_by_rule(name: str) -> None:
    assert is_secret_key(name)


def test_key_material_is_masked_under_any_name() -> None:
    pem = (
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIFHDBOBgkqhkiG\n"
        "-----END ENCRYPTED PRIVATE KEY-----"
    )
    assert redact_settings({"some.future.blob": pem}) == {"some.future.blob": MASK}
    assert pem in secrets_of_settings({"some.future.blob": pem})


@pytest.mark.parametrize(
    "name", ["sasl.username", "acks", "client.id", "security.protocol", "sasl.mechanism"]
)
def test_ordinary_settings_are_shown(name: str) -> None:
    assert not is_secret_key(name)
    assert redact_settings({name: "plain"}) == {name: "plain"}
