"""Lab 11 interview questions (numeric answers, computed here from the package; none is printed in the notebook)."""

from __future__ import annotations

from typing import Any

from autograder.harness import check_answer
from minigpt.disagg.transfer_cost import LINKS, kv_bytes_per_request, transfer_time
from minigpt.moe.arithmetic import DEEPSEEK_V3, dispatch_combine_bytes_per_token, \
    dispatch_combine_bytes_per_token_upper_bound, expected_remote_ranks
from minigpt.teaching.calculators import PRESETS

Q1 = dict(model="Llama-3-70B", prompt_tokens=8192, bytes_per_element=2, link="100 GbE")
Q2 = dict(gpus=8, prefill_rate=5.2, decode_rate=2.1)       # requests/s one GPU sustains within its SLO
Q3 = dict(ep_size=64)


def check_q1_transfer_ms(answer: Any) -> None:
    """Llama-3-70B's BF16 KV cache for an 8,192-token prompt, sent after the prefill over 100 GbE: milliseconds."""
    shape, link = PRESETS[Q1["model"]], LINKS[Q1["link"]]
    nbytes = kv_bytes_per_request(shape, Q1["prompt_tokens"], Q1["bytes_per_element"])
    right = transfer_time(nbytes, link) * 1e3
    check_answer(answer, right, "Q1 (ms to move one request's KV cache over 100 GbE)",
                 {right / 2: "K AND V: two tensors per layer",
                  right / 8: "100 GbE is 100 gigaBITS per second: 12.5 GB/s",
                  nbytes / 2**30 / 12.5 * 1e3: "bytes in GiB against a link rate in GB/s: use one kind of unit",
                  right * 64 / 8: "Llama-3-70B has 8 KV heads (GQA), not 64"},
                 unit="ms", rel=5e-4, hint="Bytes = 2 (K, V) x layers x KV heads x head_dim x tokens x 2 bytes; time = "
                                           "one message's latency + bytes / (line rate in bytes/s).")


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
    """DeepSeek-V3 at EP 64, uniform routing, one copy per remote rank (FP8 out, BF16 back): bytes per token a layer."""
    right = dispatch_combine_bytes_per_token(DEEPSEEK_V3, Q3["ep_size"]).total
    ep, k, d = Q3["ep_size"], DEEPSEEK_V3.top_k, DEEPSEEK_V3.d_model
    check_answer(answer, right, "Q3 (bytes one token sends to other ranks in one MoE layer at EP 64)",
                 {dispatch_combine_bytes_per_token_upper_bound(DEEPSEEK_V3, ep).total:
                      "one copy per chosen EXPERT is the bound; a rank holding several of the token's experts gets it "
                      "once: count the expected distinct remote ranks",
                  ep * (1 - (1 - 1 / ep) ** k) * d * 3: "the token's own rank is among the ranks hit: it costs no "
                                                          "traffic",
                  expected_remote_ranks(ep, k) * d * 4: "dispatch travels in FP8 (1 byte), combine in BF16 (2 bytes)",
                  expected_remote_ranks(ep, k) * d: "count the combine too: every remote rank sends its partial sum "
                                                    "back"},
                 unit="bytes", rel=5e-4, hint="Expected remote ranks = (ep - 1)(1 - (1 - 1/ep)^k); each carries d_model "
                                              "elements out (1 byte) and back (2 bytes).")
