"""The CLI's shape: every listed subcommand module exists and `--help` works everywhere."""

from __future__ import annotations

import importlib

import click
import pytest
from click.testing import CliRunner

from sie.cli import COMMAND_MODULES, cli, main


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_every_listed_command_module_imports(module: str) -> None:
    assert isinstance(importlib.import_module(module).command, click.Command)


def _all_commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield prefix + (name,)
        if isinstance(command, click.Group):
            yield from _all_commands(command, prefix + (name,))


def test_help_everywhere() -> None:
    runner = CliRunner()
    paths = list(_all_commands(cli))
    assert len(paths) >= len(COMMAND_MODULES)
    for path in paths:
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-command"]) == 2
    assert "No such command" in capsys.readouterr().err


def test_bad_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SIE_REQUEST_PARTITIONS", "many")
    assert main(["kafka", "status"]) == 2
    assert "request_partitions" in capsys.readouterr().err
