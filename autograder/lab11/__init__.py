"""Checks for Lab 11, disaggregated prefill/decode and mixture of experts: one module per exercise group.

    check_layer_send_ends(layer_send_ends)        the layer-wise send recurrence, likely wrong ones named  (transfer.py)
    check_prefill_and_send(prefill_and_send)      the producer: one message per layer, each sent before the next layer
                                                  runs, as the judge's logged runner and channel saw     (connector.py)
    check_receive_kv(receive_kv)                  the consumer: its own blocks, every layer before returning, out-of-
                                                  order layers, decoding equal to colocated, failures free blocks
    check_moe_forward(moe_forward)                top-k renormalised, each judge's expert once on its rows (experts.py)
    check_ep_exchange(ep_dispatch, ep_combine)    rows to their expert's rank, capacity per expert, outputs home
    check_eplb_placement(eplb_placement)          valid placements, slowest rank no worse than greedy EPLB (placement.py)
Interview questions: check_q1_transfer_ms, check_q2_placement_rate, check_q3_ep_bytes (questions.py).
Every check refuses the package's reference handed in (reference_guard); shared pieces live in common.py.
"""

from autograder.lab11.connector import check_prefill_and_send, check_receive_kv
from autograder.lab11.experts import check_ep_exchange, check_moe_forward
from autograder.lab11.placement import check_eplb_placement
from autograder.lab11.questions import check_q1_transfer_ms, check_q2_placement_rate, check_q3_ep_bytes
from autograder.lab11.transfer import check_layer_send_ends

__all__ = ["check_layer_send_ends", "check_prefill_and_send", "check_receive_kv", "check_moe_forward",
           "check_ep_exchange", "check_eplb_placement", "check_q1_transfer_ms", "check_q2_placement_rate",
           "check_q3_ep_bytes"]
