"""`python -m autograder`: one module per command (autograder/commands/), each listed in the help."""

from __future__ import annotations

import importlib

from autograder import cli
from autograder.commands import COMMANDS


def test_every_command_module_has_its_three_parts():
    for name, module in COMMANDS.items():
        command = importlib.import_module(f"autograder.commands.{module}")
        assert isinstance(command.HELP, str) and command.HELP, name
        assert callable(command.add_arguments) and callable(command.run), name


def test_the_help_lists_each_command_and_the_docstring_describes_it():
    parser = cli._parser()
    listed = set(parser._subparsers._group_actions[0].choices)
    assert listed == set(COMMANDS)
    described = {line.split()[0] for line in cli.__doc__.splitlines() if line.startswith("    ") and line.split()
                 and not line.startswith("     ")}
    assert set(COMMANDS) <= described, set(COMMANDS) - described


def test_an_unknown_course_error_is_a_message_and_exit_2(tmp_path, capsys):
    assert cli.main(["--course", str(tmp_path), "release", "--assignment", "nope"]) == 2
    assert "error:" in capsys.readouterr().err
