"""Teaching aids, apart from engine code: accelerator facts (`hardware`), roofline and KV-cache
arithmetic (`calculators`), figures (`plots`), interactive ipywidgets views (`widgets`), and the
simulators later labs add.
"""
