"""nbgrader configuration of the course (nbgrader 0.9.6).

Layout (relative to this file, the course root):
    solutions/<NN_topic>/<NN_topic>.ipynb      source notebooks (instructor version, single source of truth)
    labs/<NN_topic>/<NN_topic>.ipynb           student versions, written by `nbgrader generate_assignment`
    submitted/<student>/<NN_topic>/...         submissions          (instructor only, not committed)
    autograded/, feedback/, gradebook.db       nbgrader's outputs   (instructor only, not committed)

The autograder copies this file into temporary course folders (`python -m autograder grade`),
so every path below is relative to the folder this file sits in.
"""

import os

c = get_config()  # noqa: F821  (provided by traitlets when nbgrader loads this file)

HERE = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.root = HERE
c.CourseDirectory.course_id = "llm-inference-course"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "labs"
c.CourseDirectory.db_url = os.environ.get("COURSE_NBGRADER_DB", "sqlite:///" + os.path.join(HERE, "gradebook.db"))
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".pytest_cache"]

# Cells of our labs time models and run small training loops: allow up to 300 s per cell
# (COURSE_CELL_TIMEOUT overrides it, e.g. the test suite uses a few seconds for fixture notebooks).
c.Execute.timeout = int(os.environ.get("COURSE_CELL_TIMEOUT", "300"))
c.Execute.interrupt_on_timeout = True
c.Execute.startup_timeout = 120

# A learner's runaway print loop must not produce a gigabyte notebook.
c.LimitOutput.max_lines = 1000
c.LimitOutput.max_traceback = 100

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# ... and neither must a gigantic line or image: every output is bounded whatever its type (LimitOutputSize: text cut
# at 100k characters, any other value above 2 MB replaced by a note, 4 MB per cell, 10 MB per notebook, 1 MB of
# notebook metadata), after execution and again when feedback is made from the graded notebook.
# StoppingExecute is nbgrader's Execute, except that a cell ignoring the interrupt (or killing the kernel)
# stops the run with the points of the cells before it kept; when the grading process sets COURSE_SANDBOX,
# it starts the kernel in the bubblewrap sandbox (autograder/judging/sandbox.py), whatever kernel the notebook names.
# Feedback shows a test cell's grade and failure message, never its source (HideTestSources).
try:
    from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, GetGrades, IgnorePattern,
                                        LimitOutput, SaveAutoGrades)

    from autograder.grading.preprocessors import HideTestSources, LimitOutputSize, StoppingExecute

    c.Autograde.autograde_preprocessors = [StoppingExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                           LimitOutputSize, SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
    c.LimitOutputSize.max_chars = 100_000
    c.LimitOutputSize.max_output_bytes = 2_000_000
    c.LimitOutputSize.max_cell_bytes = 4_000_000
    c.LimitOutputSize.max_notebook_bytes = 10_000_000
    c.LimitOutputSize.max_metadata_bytes = 1_000_000
    c.GenerateFeedback.preprocessors = [GetGrades, HideTestSources, LimitOutputSize, CSSHTMLHeaderPreprocessor]
except ImportError:  # autograder not installed (e.g. a bare nbgrader install): nbgrader's defaults apply
    pass
