"""Lab 11 interview questions (numeric answers, computed here from the package; none is printed in the notebook)."""

from __future__ import annotations

from typing import Any

from autograder.harness import check_answer
from minigpt.disagg.transfer_cost import LINKS, exposed_after_compute, kv_bytes_per_request, transfer_time
from minigpt.moe.arithmetic import DEEPSEEK_V3, expected_remote_ranks, max_nodes_reached
from minigpt.costmodel.calculators import PRESETS

Q1 = dict(model="Llama-3-70B", prompt_tokens=8192, bytes_per_element=2, link="25 GbE", prefill_s=0.64)
Q2 = dict(gpus=8, prefill_rate=5.2, decode_rate=2.1)       # requests/s one GPU sustains within its SLO
Q3 = dict(nodes=8)                                         # EP 64: 8 nodes of 8 GPUs, one expert group a node


def _q1_parts() -> tuple[list[float], list[float], float]:
    """Q1's per-layer compute and send times (s) and one layer's bytes."""
    shape, link = PRESETS[Q1["model"]], LINKS[Q1["link"]]
    layer_bytes = kv_bytes_per_request(shape, Q1["prompt_tokens"], Q1["bytes_per_element"]) / shape.n_layers
    compute = [Q1["prefill_s"] / shape.n_layers] * shape.n_layers
    return compute, [transfer_time(layer_bytes, link)] * shape.n_layers, layer_bytes


def check_q1_transfer_ms(answer: Any) -> None:
    """Llama-3-70B's BF16 KV for an 8,192-token prompt, sent layer by layer as the 0.64 s prefill computes each layer,
    over one 25 GbE link, one message at a time: milliseconds from the prefill's end to the last layer's arrival."""
    compute, send, layer_bytes = _q1_parts()
    right = exposed_after_compute(compute, send) * 1e3
    n, c, s = len(compute), compute[0], send[0]
    check_answer(answer, right, "Q1 (ms the layer-wise sends run on after the prefill)",
                 {s * 1e3: "the sends do not keep up: each layer takes longer to send than to compute, so they queue "
                           "behind each other and more than the last layer is left after the prefill",
                  n * s * 1e3: "the sends overlap the prefill: only what is left after its end counts",
                  (n * s - n * c) * 1e3: "the first send cannot start before the first layer is computed",
                  exposed_after_compute(compute, [transfer_time(layer_bytes / 2, LINKS[Q1["link"]])] * n) * 1e3:
                      "K AND V: two tensors per layer",
                  exposed_after_compute(compute, [2e-5 + layer_bytes / 25e9] * n) * 1e3:
                      "25 GbE is 25 gigaBITS per second: 3.125 GB/s"},
                 unit="ms", rel=5e-4, hint="Layer i's send ends at max(its compute's end, the previous send's end) + "
                                           "its own send time; the answer is the last end minus the prefill's end.")


def _best_split() -> tuple[float, int]:
    q = Q2
    return max((min(p * q["prefill_rate"], (q["gpus"] - p) * q["decode_rate"]), p) for p in range(1, q["gpus"]))


def check_q2_placement_rate(answer: Any) -> None:
    """8 GPUs split into p prefill and 8 - p decode workers: the largest request rate served within both SLOs."""
    q = Q2
    right, _ = _best_split()
    fractional = q["gpus"] * q["prefill_rate"] * q["decode_rate"] / (q["prefill_rate"] + q["decode_rate"])
    check_answer(answer, right, "Q2 (requests/s the best whole-GPU split serves)",
                 {fractional: "GPUs come whole: try p = 1 .. 7 and keep the best min(p x prefill rate, "
                              "(8 - p) x decode rate)",
                  q["gpus"] / 2 * q["decode_rate"]: "an even 4 + 4 split leaves the prefill side idle: the decode "
                                                     "side limits it",
                  q["gpus"] * q["decode_rate"]: "every request needs BOTH a prefill and a decode worker: the rate is "
                                                 "the smaller of the two pools' rates"},
                 unit="requests/s", rel=1e-3, hint="A split serves min(p x prefill rate, d x decode rate) requests/s.")


def check_q3_ep_bytes(answer: Any) -> None:
    """DeepSeek-V3 at EP 64 on 8 nodes, one expert group a node, group-limited routing, one copy per other node that
    holds any of the token's experts (FP8 out, BF16 back): the most bytes one token moves between nodes a layer."""
    v3, n = DEEPSEEK_V3, Q3["nodes"]
    remote = min(max_nodes_reached(v3, n), n - 1)     # its own node need not be among the groups it picks
    right = remote * v3.d_model * (1 + 2)
    check_answer(answer, right, "Q3 (the most bytes one token moves between nodes in one MoE layer)",
                 {(remote - 1) * v3.d_model * 3: "the token's own node need not be among the 4 groups it picks: all "
                                                 "4 can be other nodes",
                  (n - 1) * v3.d_model * 3: "group-limited routing keeps a token's experts inside 4 of the 8 groups, "
                                            "so inside 4 nodes",
                  v3.top_k * v3.d_model * 3: "one copy per NODE (forwarded inside it), not one per expert",
                  remote * v3.d_model * 4: "dispatch travels in FP8 (1 byte), combine in BF16 (2 bytes)",
                  remote * v3.d_model: "count the combine too: every node sends its partial sum back",
                  expected_remote_ranks(n, v3.top_k) * v3.d_model * 3: "the question asks for the most, not the "
                                                                       "expectation under uniform routing"},
                 unit="bytes", rel=5e-4, hint="How many other nodes can a token's experts live on at most? Each such "
                                              "node gets d_model elements out (1 byte) and sends d_model back (2 bytes).")
