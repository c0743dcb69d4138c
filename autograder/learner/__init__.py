"""Learner commands: the never-overwritten workspace and the progress report.
"""
