"""Disaggregated serving (lab 11): prefill on one set of GPUs, decode on another, the KV cache moved between them.

* `transfer_cost`: the bytes of one request's KV cache (dense GQA or MLA's latent), the links they travel over
  (NVLink, InfiniBand NDR, Ethernet), the time to send them, and how much of it hides behind the prefill when the
  layers are sent one by one, or behind the first decode step.
* `layerwise`: the prefill one layer at a time (`LayerRunner`) and the two producers, layer-wise
  (`prefill_and_send`) and whole-request (`prefill_then_send`).
* `channel`: what carries the KV (`KVMessage`): in one process (`QueueChannel`), between two gloo processes
  (`GlooChannel`, bytes counted), or failing on purpose (`FailingChannel`); `TransferError`, `TransferTimeout`.
* `receiver`: the decode side: its own paged pool (`DecodeKVStore`), the receiving loop (`receive_kv`) and greedy
  decoding from the received blocks (`decode_from_blocks`).
* `ttft`: two real processes serving prompts colocated, layer-wise and whole-request, and where each request's
  time to first (and second) token goes (`ttft_breakdown`).
* `clock`: one clock for the processes of a run (`shared_clock`).
* `timeline`: a shared log of who did what when (`Timeline`, `LoggedRunner`, `RecordingChannel`, `ScriptedChannel`):
  the notebook's picture of the two producers, and the objects the grader hands a learner's connector.
* `goodput_sim`: DistServe's question on lab 00's roofline: colocated against P prefill + D decode GPUs, goodput
  under a TTFT and a TPOT target, the best split.
* `measured_goodput`: the same comparison served for real on this machine's cores.
"""

from minigpt.disagg.channel import (FailingChannel, GlooChannel, KVMessage, QueueChannel, TransferError,
                                    TransferTimeout)
from minigpt.disagg.layerwise import LayerRunner, prefill_and_send, prefill_then_send
from minigpt.disagg.receiver import DecodeKVStore, decode_from_blocks, receive_kv
from minigpt.disagg.ttft import MODES, ttft_breakdown

__all__ = ["KVMessage", "TransferError", "TransferTimeout", "QueueChannel", "GlooChannel", "FailingChannel",
           "LayerRunner", "prefill_and_send", "prefill_then_send", "DecodeKVStore", "receive_kv",
           "decode_from_blocks", "MODES", "ttft_breakdown"]
