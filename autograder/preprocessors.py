"""`autograder.preprocessors`, the public path (named by nbgrader_config.py and instructors' copies): the module is autograder/grading/preprocessors.py."""

from autograder.grading.preprocessors import *  # noqa: F401,F403
from autograder.grading.preprocessors import HideTestSources, LimitOutputSize, StoppingExecute  # noqa: F401
