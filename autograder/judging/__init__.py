"""Running test cells where the learner's code cannot decide them: the judge process, the kernel's
serving side, JupyterLab's check cells, the witness (a second verdict without the reference), and
the bubblewrap sandbox every learner process runs in.
"""
