"""Teaching aids, apart from engine code: accelerator facts (`hardware`), roofline and KV-cache
arithmetic (`calculators`), figures (`plots`), interactive ipywidgets views (`widgets`), the
serving simulator of lab 03 (`serving_simulator`: the lab 03 scheduler on a roofline clock, e.g. Llama-3-8B
on an H100), and the simulators later labs add.
"""
