"""The daemons read the migration revisions without importing Alembic; Alembic agrees."""

from __future__ import annotations

import subprocess
import sys

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
