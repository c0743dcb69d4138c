"""Teaching aids, apart from engine code: accelerator facts (`hardware`), roofline and KV-cache
arithmetic (`calculators`), attention HBM traffic naive vs flash (`attention_traffic`, lab 04), figures (`plots`), interactive ipywidgets views (`widgets`; lab 04's online-softmax stepper `flash_stepper`), and the
simulators later labs add.
"""
