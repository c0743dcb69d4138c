"""The GPU tier: calibration of the speed thresholds, `make gpu-check`, and the slow implementations
the thresholds are calibrated against.
"""
