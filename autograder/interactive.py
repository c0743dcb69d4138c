"""`autograder.interactive`, the public path (named by config/ipython_kernel_config.py and instructors' copies): the module is autograder/judging/interactive.py."""

from autograder.judging.interactive import *  # noqa: F401,F403
from autograder.judging.interactive import load_ipython_extension  # noqa: F401
