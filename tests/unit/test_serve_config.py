"""`outbox serve`'s tokens file, its refusal to listen beyond the machine without tokens, and
the one line of a missing `serve` extra."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from outbox.cli import main
from outbox.core.errors import ConfigurationError
from outbox.http import ServeConfig, require_extra
from outbox.http.tokens import find, parse_tokens, read_tokens

SECRET = "s3cret-token-0123456789"


def test_a_tokens_file_gives_tokens_with_scopes(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(
        f"# who may do what\n\npublish,consume {SECRET}\n"
        f"  admin   {'a' * 32}  \nconsume {'c' * 16}\n"
    )
    tokens = read_tokens(str(path))
    assert [sorted(t.scopes) for t in tokens] == [["consume", "publish"], ["admin"], ["consume"]]
    assert find(tokens, SECRET) is tokens[0]
    assert find(tokens, SECRET + "x") is None and find(tokens, "") is None
    assert tokens[1].allows("publish") and tokens[1].allows("consume")  # admin has all
    assert not tokens[2].allows("publish") and not tokens[0].allows("admin")
    assert SECRET not in repr(tokens)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (f"publish\n{SECRET}", "line 1: expected `SCOPE[,SCOPE] TOKEN`"),
        (f"# c\npublish {SECRET} extra", "line 2: expected"),
        (f"\n\nread {SECRET}", "line 3: unknown scope 'read'"),
        (f"publish,,consume {SECRET}", "line 1: unknown scope ''"),
        ("publish short", "line 1: the token is shorter than 16"),
        (f"publish {SECRET}\nconsume {SECRET}", "line 2: the token of an earlier line again"),
        ("# nothing\n", "holds no token"),
        # Never matched: a header is read as Latin-1, the file as UTF-8.
        (f"publish {SECRET}\u00e9", "line 1: the token has a character other than printable"),
        (f"publish {SECRET}\x7f", "line 1: the token has a character other than printable"),
    ],
)
def test_a_bad_tokens_file_names_its_line_and_never_the_token(text: str, said: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_tokens(text, "tokens file 't'")
    assert said in str(raised.value)
    assert SECRET not in str(raised.value) and "short" not in str(raised.value).split(":", 1)[0]


def test_a_tokens_file_with_a_byte_order_mark_and_crlf_lines_is_read(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_bytes(f"\ufeffpublish {SECRET}\r\n\r\nconsume {'c' * 16}\r\n".encode())
    tokens = read_tokens(str(path))
    assert [sorted(t.scopes) for t in tokens] == [["publish"], ["consume"]]
    assert find(tokens, SECRET) is tokens[0]


def test_an_empty_tokens_file_path_is_refused_not_read_as_no_tokens() -> None:
    with pytest.raises(ConfigurationError, match="the tokens file is an empty path"):
        ServeConfig.of(tokens_file="")
    assert ServeConfig.of(tokens_file=None).tokens == ()


def test_another_address_than_loopback_needs_tokens(tmp_path: Path) -> None:
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert ServeConfig(host=host).host == host
    with pytest.raises(ConfigurationError, match="without tokens: give --tokens-file"):
        ServeConfig(host="0.0.0.0")
    path = tmp_path / "tokens"
    path.write_text(f"admin {SECRET}\n")
    assert len(ServeConfig.of(tokens_file=str(path), host="0.0.0.0").tokens) == 1


def test_serve_with_a_bad_tokens_file_is_one_line_without_the_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"publish {SECRET}\nwrite {SECRET}x\n")
    code = main(
        ["serve", "--database-url", "postgresql://u@127.0.0.1:1/db", "--tokens-file", str(path)]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert f"tokens file {str(path)!r} line 2: unknown scope 'write'" in err
    assert SECRET not in err and len(err.strip().splitlines()) == 1


def test_a_missing_serve_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def without_fastapi(name: str, *args: Any) -> Any:
        return None if name == "fastapi" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_fastapi)
    with pytest.raises(ConfigurationError) as raised:
        require_extra()
    assert str(raised.value).startswith(
        "outbox serve needs the serve extra: pip install 'pg-kafka-outbox[serve]'"
    )


def test_the_tokens_file_comes_from_its_variable_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# ok\npublish {SECRET}\n\nconsume\n")
    monkeypatch.setenv("OUTBOX_SERVE_TOKENS_FILE", str(path))
    code = main(["serve", "--database-url", "postgresql://u@127.0.0.1:1/db"])
    err = capsys.readouterr().err
    assert code == 1 and "line 4: expected `SCOPE[,SCOPE] TOKEN`" in err and SECRET not in err


def test_outbox_serve_without_its_extra_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "uvicorn" else real(name, *args),
    )
    assert main(["serve", "--database-url", "postgresql://u@127.0.0.1:1/db"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "outbox: error: outbox serve needs the serve extra: pip install 'pg-kafka-outbox[serve]'"
    )
    assert len(err.strip().splitlines()) == 1
