"""First process inside a grading sandbox (run as `python -I sandbox_boot.py ... -- KERNEL ARGV`).

bubblewrap has already built the sandbox's file system and namespaces; this script, standard library only,
finishes the job and then becomes the kernel:

1. drops to an unprivileged user id when bubblewrap ran as root (so that RLIMIT_NPROC counts only the
   sandbox's processes: the kernel ignores that limit for root), keeping no capability;
2. sets the resource limits (RLIMIT_AS memory, RLIMIT_NPROC processes and threads, RLIMIT_FSIZE largest file,
   RLIMIT_CPU seconds, no core files);
3. copies the submission (read-only at /submission) into the size-capped /tmp/work and makes it the cwd;
4. execs the kernel.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys


def main(argv: list[str]) -> None:
    split = argv.index("--")
    p = argparse.ArgumentParser()
    p.add_argument("--uid", type=int, default=-1)
    p.add_argument("--gid", type=int, default=-1)
    p.add_argument("--memory", type=int, required=True)
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--fsize", type=int, required=True)
    p.add_argument("--cpu", type=int, required=True)
    p.add_argument("--work", default="/tmp/work")
    args = p.parse_args(argv[:split])
    cmd = argv[split + 1:]
    if args.uid >= 0:
        os.setgroups([])
        os.setgid(args.gid)
        os.setuid(args.uid)          # from root to a plain uid: every capability is dropped with it
    limits = {resource.RLIMIT_AS: args.memory, resource.RLIMIT_NPROC: args.nproc,
              resource.RLIMIT_FSIZE: args.fsize, resource.RLIMIT_CPU: args.cpu, resource.RLIMIT_CORE: 0}
    for which, value in limits.items():
        hard = value + 5 if which == resource.RLIMIT_CPU else value   # SIGXCPU at the soft limit, KILL 5 s later
        resource.setrlimit(which, (value, hard))
    home = os.environ.get("HOME", "/tmp/home")
    os.makedirs(home, exist_ok=True)
    if os.path.isdir("/submission"):
        shutil.copytree("/submission", args.work, symlinks=True, dirs_exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    os.chdir(args.work)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
