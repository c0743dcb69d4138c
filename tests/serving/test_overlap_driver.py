"""The overlap driver (lab 12, Exercise 2): the reference loop gives the serial engine's tokens and overlaps every
step; each operation out of order is refused with the rule it breaks, and the log tells overlapped from serial."""

from __future__ import annotations

import pytest

from minigpt.sampling import SamplingParams
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.overlap_driver import OverlapDriver, run_overlapped

PROMPTS = [list(range(10, 25)), list(range(40, 47)), list(range(60, 90))]


def _driver(tiny, *, overlapped: bool = True) -> OverlapDriver:
    engine = LLMEngine(tiny, EngineConfig(num_blocks=32, block_size=8, max_num_seqs=2, async_scheduling=overlapped))
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", p, max_tokens=6, sampling=SamplingParams())
    return OverlapDriver(engine)


def test_the_reference_loop_gives_the_serial_tokens_and_overlaps_every_step(tiny):
    serial = LLMEngine(tiny, EngineConfig(num_blocks=32, block_size=8, max_num_seqs=2))
    want = [o.token_ids for o in serial.generate(PROMPTS, SamplingParams(), max_tokens=6)]
    driver = _driver(tiny)
    run_overlapped(driver)
    driver.engine.close()
    assert [driver.tokens[f"r{i}"] for i in range(3)] == want
    assert driver.overlapped_steps() == driver.landed_steps() > 0 and not driver.has_unfinished()


def test_operations_out_of_order_are_refused_with_their_rule(tiny):
    with pytest.raises(ValueError, match="async_scheduling"):
        _driver(tiny, overlapped=False)
    driver = _driver(tiny)
    first = driver.schedule()
    with pytest.raises(ValueError, match="scheduled and not launched"):
        driver.schedule()
    flight = driver.launch(first)
    with pytest.raises(ValueError, match="before apply_ahead"):
        driver.land(flight)
    driver.apply_ahead(flight)
    ahead = driver.schedule()
    with pytest.raises(ValueError, match="ready\\(\\) it once"):
        driver.launch(ahead)
    with pytest.raises(ValueError, match="in flight"):
        driver.ready(ahead)
    driver.land(flight)
    assert driver.overlapped_steps() == 1
    with pytest.raises(ValueError, match="not a launched step"):
        driver.land(flight)
    driver.launch(driver.ready(ahead))
    driver.engine.close()
