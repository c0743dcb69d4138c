"""The course autograder, in floors; each imports only itself and the floors below (tests/autograder/test_import_graph.py):

- autograder.paths, .machine, .processes   the course's folders, the CPU's name, process groups
- autograder.checking     what every check stands on: the wire to the learner's process, the reference guard, tensor
                          traces, calibrated thresholds, learner-facing errors, small shared models
- autograder.harness      helpers for check functions (GPU tier gating, ratio speed checks, quiet()); .gpu_bench
- autograder.labNN        check functions called from the graded cells of lab NN; autograder.interview
- autograder.judging      the judge that runs test cells, the kernel's side, the witness, the sandbox
- autograder.grading      the nbgrader flow: real nbgrader runs, the class batch, intake, preprocessors, notebooks
- autograder.gpu_tier     `make calibrate` and `make gpu-check`; autograder.learner: workspace and progress
- autograder.cli, .commands, .doctor  `python -m autograder --help`, one module per command (also behind the
                          Makefile targets); what this machine can run
"""

# In a lab's kernel, errors name the exercise instead of showing the course's internals (learner_errors.py).
from autograder.checking.learner_errors import install_in_kernel as _install_in_kernel

_install_in_kernel()
