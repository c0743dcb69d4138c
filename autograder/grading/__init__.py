"""The nbgrader flow: real nbgrader runs (release, autograde, feedback, export), the batch over a
class, submission intake, the preprocessors, the gradebook guard, notebook normalisation, Run All,
copied-answer similarity and output limits.
"""
