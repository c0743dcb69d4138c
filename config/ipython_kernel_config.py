# The course kernel's IPython settings, copied into .venv/etc/ipython/ by `make setup`.
# Inline matplotlib figures are rendered at twice their pixel size and shown at their size: sharp on
# high-density screens, never stretched.
c = get_config()  # noqa: F821  (IPython's config loader provides it)
c.InlineBackend.figure_formats = {"retina"}
# Check cells are judged in a separate process, as the grader does (autograder/judging/interactive.py).
c.InteractiveShellApp.extensions = ["autograder.judging.interactive"]
