"""hub: a class on JupyterHub on this machine (instructor, as root): setup | start | status | teardown."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HELP = "a class on JupyterHub on this machine: setup | start | status | teardown (as root)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["setup", "start", "status", "teardown"])
    p.add_argument("--root", type=Path, help="the class's folder (default /srv/llm-course-hub, LLM_COURSE_HUB_ROOT)")
    p.add_argument("--students", type=int, default=3, help="setup: how many students")
    p.add_argument("--prefix", default="llmc", help="setup: user names <prefix>-instructor, <prefix>-student-N")
    p.add_argument("--port", type=int, default=8000, help="start: the hub's port on 127.0.0.1")


def _print_roster(roster) -> None:
    print(f"instructor: {roster.instructor} (password {roster.passwords[roster.instructor]}), course in "
          f"{roster.course_dir}")
    for name in roster.students:
        print(f"student:    {name} (password {roster.passwords[name]})")
    print(f"exchange:   {roster.exchange}")


def run(args: argparse.Namespace, course: Path) -> int:
    try:
        return _run(args, course)
    except (FileNotFoundError, FileExistsError, PermissionError, RuntimeError, ValueError) as err:
        print(f"hub {args.action}: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, course: Path) -> int:
    from autograder.hub import classroom

    root = args.root or classroom.DEFAULT_ROOT
    if args.action == "setup":
        _print_roster(classroom.create_class(root, args.students, prefix=args.prefix, repo=course))
        print(f"class state in {root / classroom.STATE} (mode 600); start the hub with `make hub`")
    elif args.action == "status":
        _print_roster(classroom.load_roster(root))
    elif args.action == "teardown":
        removed = classroom.remove_class(root)
        print(f"removed {', '.join(removed) or 'no user'}, their homes and the exchange")
    else:
        classroom.load_roster(root)                              # a clear error when there is no class yet
        config = course / "config" / "hub" / "jupyterhub_config.py"
        hub = course / ".venv" / "bin" / "jupyterhub"
        env = dict(os.environ, LLM_COURSE_HUB_ROOT=str(root), LLM_COURSE_HUB_PORT=str(args.port))
        print(f"JupyterHub on http://127.0.0.1:{args.port} (Ctrl-C stops it)", flush=True)
        os.chdir(root)
        os.execve(str(hub), [str(hub), "-f", str(config)], env)
    return 0
