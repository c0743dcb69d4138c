"""Teaching aids, apart from engine code: accelerator facts (`hardware`), roofline and KV-cache
arithmetic (`calculators`), speculative decoding's expected tokens and cost model
(`speculative_calculator`), a chi-square goodness-of-fit test (`goodness_of_fit`), figures (`plots`), interactive ipywidgets views (`widgets`, `speculative_player`), and the
simulators later labs add.
"""
