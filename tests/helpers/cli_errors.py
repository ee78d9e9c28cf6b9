"""What a command's console entry point prints when it refuses its arguments."""

import sys

import pytest


def one_line_error(cli, prog, argv, monkeypatch, capsys, status=2) -> str:
    """The error `cli()` run as `prog ARGV` prints: exit status `status`, one line on stderr, nothing on stdout."""
    monkeypatch.setattr(sys, "argv", [prog, *map(str, argv)])
    with pytest.raises(SystemExit) as exit_info:
        cli()
    captured = capsys.readouterr()
    assert exit_info.value.code == status and captured.out == "" and captured.err.count("\n") == 1, captured
    return captured.err.strip()
