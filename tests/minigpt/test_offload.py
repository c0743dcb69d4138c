"""Load or recompute: the crossover is where loading starts to win, and it moves with the link and the KV size."""

import pytest

from minigpt.costmodel.calculators import PRESETS
from minigpt.costmodel.hardware import ACCELERATORS
from minigpt.costmodel.offload import LINKS, crossover_tokens, load_seconds, recompute_seconds, should_load

H100 = ACCELERATORS["H100-SXM"]


@pytest.mark.parametrize("model", ["Llama-3-8B", "Llama-2-7B (MHA)"])
@pytest.mark.parametrize("link", sorted(LINKS))
def test_the_crossover_is_where_loading_starts_to_win(model, link):
    shape, l = PRESETS[model], LINKS[link]
    c = crossover_tokens(shape, l, H100)
    assert c is not None
    assert should_load(shape, c, l, H100) and not should_load(shape, c - 1, l, H100)
    assert all(should_load(shape, n, l, H100) for n in (c + 1, 2 * c, 10 * c))


def test_grouped_query_attention_makes_loading_win_almost_at_once():
    gqa, mha, nvme = PRESETS["Llama-3-8B"], PRESETS["Llama-2-7B (MHA)"], LINKS["NVMe SSD (PCIe 4.0 x4)"]
    assert crossover_tokens(gqa, nvme, H100) < 64 < 4096 < crossover_tokens(mha, nvme, H100)
    assert load_seconds(gqa, 0, nvme) == 0 == recompute_seconds(gqa, 0, H100)


def test_a_slow_enough_link_never_wins():
    from minigpt.costmodel.offload import Link
    dial_up = Link("slow", 1e6, 1e-3, "a test")
    assert crossover_tokens(PRESETS["Llama-3-8B"], dial_up, H100, limit=1 << 14) is None
    with pytest.raises(ValueError, match="mfu"):
        recompute_seconds(PRESETS["Llama-3-8B"], 10, H100, mfu=0)
