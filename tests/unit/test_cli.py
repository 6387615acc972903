"""The conventions of the `outbox` command: its exit codes, help, version and flags."""

from __future__ import annotations

import pytest

from outbox.cli import main


def test_demo_says_where_it_runs_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    """The package does not ship examples/: `outbox demo` is one line pointing at the checkout."""
    for argv in (["demo"], ["demo", "--messages", "5"]):
        assert main(argv) == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err.count("\n") == 1
        assert err.startswith("outbox: error: the demo runs the example services")
        assert "./run demo" in err and "python -m examples.demo" in err
