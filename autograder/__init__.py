"""The course autograder.

- autograder.harness    helpers for check functions (GPU tier gating, ratio speed checks, quiet())
- autograder.labNN      check functions called from the graded cells of lab NN
- autograder.thresholds the calibrated speed thresholds; autograder.calibrate measures them (`make calibrate`)
  against autograder.slow_implementations
- autograder.gpu_check  `make gpu-check`: the GPU tier and its benchmarks (autograder.gpu_bench), a resumable report
- autograder.grading    real nbgrader runs: grade one notebook, instructor batch, feedback, export, release
- autograder.notebooks  notebook normalization (outputs stripped, stable JSON)
- autograder.doctor     what this machine can run
- `python -m autograder --help` is the command line (also behind the Makefile targets).
"""

# In a lab's kernel, errors name the exercise instead of showing the course's internals (learner_errors.py).
from autograder.learner_errors import install_in_kernel as _install_in_kernel

_install_in_kernel()
