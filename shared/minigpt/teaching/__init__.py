"""Teaching aids, apart from engine code: accelerator facts (`hardware`), roofline and KV-cache
arithmetic (`calculators`), figures (`plots`), interactive ipywidgets views (`widgets`; `pool_view`, lab 02's paged-pool view), and the
simulators later labs add.
"""
