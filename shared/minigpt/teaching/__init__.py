"""Teaching aids, apart from engine code: accelerator facts (`hardware`), roofline and KV-cache
arithmetic (`calculators`), figures (`plots`), interactive ipywidgets views (`widgets`; lab 05's `quant_explorer`), and the
simulators later labs add.
"""
