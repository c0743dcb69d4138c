"""What every check stands on: the wire between judge and kernel (framing, remote handles, the codec,
what the judge serves), the reference guard, tensor traces, calibrated thresholds, learner-facing
errors, and the small models several labs' checks share.
"""
