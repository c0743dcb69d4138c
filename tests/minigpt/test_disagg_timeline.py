"""The logged runner and channels lab 11's notebook draws and its grader hands a learner's connector."""

from __future__ import annotations

import pytest
import torch

from minigpt.config import ModelConfig
from minigpt.disagg.channel import KVMessage, TransferError, TransferTimeout
from minigpt.disagg.layerwise import LayerRunner, prefill_and_send, prefill_then_send
from minigpt.disagg.timeline import LoggedRunner, RecordingChannel, ScriptedChannel, Timeline
from minigpt.model import GPT
from minigpt_fixtures import seeded

CFG = ModelConfig(vocab_size=64, max_seq_len=32, d_model=16, n_layers=3, n_heads=2, n_kv_heads=1, d_ff=32)


def _logged(producer) -> tuple[list[str], RecordingChannel, int]:
    model = seeded(0, lambda: GPT(CFG).eval())
    log = Timeline()
    channel = RecordingChannel(log)
    first = producer(LoggedRunner(LayerRunner(model), log), [1, 2, 3, 4, 5], channel, "r")
    return log.kinds(), channel, first


def test_the_layer_wise_producer_sends_each_layer_before_the_next_runs() -> None:
    kinds, channel, _ = _logged(prefill_and_send)
    assert kinds == ["embed", "layer 0", "send 0", "layer 1", "send 1", "layer 2", "send 2", "logits"]
    assert [(m.request_id, m.layer, tuple(m.k.shape)) for m in channel.messages] == [("r", i, (5, 1, 8)) for i in range(3)]


def test_the_whole_request_producer_sends_after_the_prefill_the_same_kv() -> None:
    kinds, channel, first = _logged(prefill_then_send)
    assert kinds == ["embed", "layer 0", "layer 1", "layer 2", "logits", "send 0", "send 1", "send 2"]
    _, layerwise, first_layerwise = _logged(prefill_and_send)
    assert first == first_layerwise
    assert all(torch.equal(a.k, b.k) and torch.equal(a.v, b.v) for a, b in zip(channel.messages, layerwise.messages))


def _message(layer: int) -> KVMessage:
    return KVMessage("r", layer, torch.zeros(2, 1, 4), torch.ones(2, 1, 4), [])


def test_a_scripted_channel_hands_out_its_messages_in_order_then_times_out() -> None:
    channel = ScriptedChannel([_message(1), _message(0)])
    assert [channel.recv(1.0).layer for _ in range(2)] == [1, 0]
    with pytest.raises(TransferTimeout, match="already received"):
        channel.recv(1.0)
    assert channel.received == 3 and channel.log.kinds() == ["recv 1", "recv 0", "recv"]


@pytest.mark.parametrize("timeout, error", [(False, TransferError), (True, TransferTimeout)])
def test_a_scripted_channel_breaks_where_it_is_told(timeout: bool, error: type) -> None:
    channel = ScriptedChannel([_message(0), _message(1)], fail_at=1, timeout=timeout)
    assert channel.recv(1.0).layer == 0
    with pytest.raises(error, match="broke at message 1"):
        channel.recv(1.0)
