"""Teaching aids, apart from engine code: accelerator facts (`hardware`), roofline and KV-cache
arithmetic (`calculators`), the tensor/pipeline-parallel cost model (`parallel_cost`, lab 07), figures
(`plots`), interactive ipywidgets views (`widgets`), and the simulators later labs add.
"""
