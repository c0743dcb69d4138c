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
    parser = cli._parser([])
    listed = set(parser._subparsers._group_actions[0].choices)
    assert listed == set(COMMANDS)
    described = {line.split()[0] for line in cli.__doc__.splitlines() if line.startswith("    ") and line.split()
                 and not line.startswith("     ")}
    assert set(COMMANDS) <= described, set(COMMANDS) - described


def test_a_light_command_does_not_import_torch(repo_root):
    """`make lab` runs `workspace` before JupyterLab starts: it must not pay for another command's imports."""
    import subprocess
    import sys

    code = "import sys; from autograder import cli; cli._parser(['workspace']); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_unknown_course_error_is_a_message_and_exit_2(tmp_path, capsys):
    assert cli.main(["--course", str(tmp_path), "release", "--assignment", "nope"]) == 2
    assert "error:" in capsys.readouterr().err


def test_gpu_check_and_calibrate_need_no_nbgrader(repo_root):
    """A GPU machine's own python may have torch and triton but no nbgrader (seen on an H200 image, 2026-11-26):
    the command line must still parse and run the GPU tier's commands there."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['nbgrader'] = None\n"
            "from autograder import cli\n"
            "sys.exit(cli.main(['gpu-check', '--only', 'machine']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]          # 2: no CUDA GPU here, nothing was run
    assert "no CUDA GPU here" in proc.stdout
