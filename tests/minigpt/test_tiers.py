"""Host and file tiers for evicted KV blocks: copies kept, LRU spills to files, drops past both, async loads."""

import pytest
import torch

from minigpt.cache.tiers import TieredStore


def _block(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 4, 1, 8, generator=g), torch.randn(2, 4, 1, 8, generator=g)


def test_put_spill_drop_and_load(tmp_path):
    with TieredStore(host_blocks=2, file_blocks=2, directory=tmp_path) as store:
        blocks = {key: _block(key) for key in range(5)}
        for key, (k, v) in blocks.items():
            store.put(key, k, v)
            k.zero_()                                           # the store kept a copy
        assert [store.where(key) for key in range(5)] == [None, "file", "file", "host", "host"]
        assert store.stats["spilled"] == 3 and store.stats["dropped"] == 1
        for key in (1, 4):
            k, v = store.load(key).result()
            want = _block(key)
            assert torch.equal(k, want[0]) and torch.equal(v, want[1])
        with pytest.raises(KeyError):
            store.load(0)
        assert len(list(tmp_path.glob("*.safetensors"))) == 2
    assert list(tmp_path.glob("*.safetensors")) == []             # close removes the files


def test_without_a_file_tier_the_lru_block_is_dropped():
    with TieredStore(host_blocks=2) as store:
        for key in range(3):
            store.put(key, *_block(key))
        store.load(1).result()                                    # 1 is now more recent than 2
        store.put(3, *_block(3))
        assert [store.where(key) for key in range(4)] == [None, "host", None, "host"]


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="host_blocks"):
        TieredStore(host_blocks=0)
