"""The daemons read the migration revisions without importing Alembic; Alembic agrees."""

from __future__ import annotations

import subprocess
import sys

from outbox.pglog.log import HEAD_REVISION, LOG_MIGRATIONS
from outbox.postgres import migrate


def test_revisions_read_from_the_scripts_are_alembics() -> None:
    assert migrate._revisions() == migrate._alembic_revisions()
    assert migrate.head_revision() in migrate.known_revisions()


def test_checking_the_schema_version_does_not_import_alembic() -> None:
    code = (
        "import sys; from outbox.postgres import migrate; migrate.head_revision(); "
        "migrate.known_revisions(); print('alembic' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_logs_revisions_are_read_as_outboxs_are() -> None:
    # The log's migrations go through the same Migrations as outbox's own (one Alembic setup).
    directory = LOG_MIGRATIONS.directory()
    assert migrate._revisions(directory) == migrate._alembic_revisions(directory)
    assert LOG_MIGRATIONS.head_revision() == HEAD_REVISION
    assert migrate.OUTBOX.head_revision() == migrate.head_revision()
