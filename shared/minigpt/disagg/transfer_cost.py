"""What handing one request's KV cache from a prefill GPU to a decode GPU costs: the bytes, the link time, the overlap.

    shape, gpu, ib = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"], LINKS["InfiniBand NDR (1 port)"]
    kv_bytes_per_request(shape, 4096, 2)                # 536_870_912 bytes: 512 MiB (131_072 a token)
    kv_bytes_per_request(DEEPSEEK_V3_MLA, 4096, 2)      # 287_834_112 bytes: 61 layers x (512 + 64) x 2 a token
    transfer_time(2**29, ib)                            # 5e-6 + 2**29 / 50e9 s: about 10.7 ms
    r = layerwise_overlap(shape, 4096, gpu, ib)
    r.prefill_s, r.transfer_after_prefill_s, r.exposed_layerwise_s, r.first_decode_step_s

The model, first order like lab 00's:

* Bytes. A dense model's cache (MHA, GQA, MQA) is `calculators.kv_cache_bytes`: 2 * n_layers * n_kv_heads * head_dim
  * tokens * bytes. An MLA model caches one latent and one shared RoPE key a layer, `kv_compression.kv_bytes`:
  n_layers * (kv_lora_rank + rope_dim) * tokens * bytes. Every layer holds the same share, bytes / n_layers.
* A link. Sending n bytes as m messages takes t = m * alpha + n / B: B the link's bandwidth ONE WAY in bytes/s
  (decimal: 1 GB/s = 1e9 B/s), alpha a fixed cost per message. The bandwidths in LINKS are the vendors' line rates; a
  real transfer reaches less (NVIDIA/nccl issue 1264: CUDA's p2pBandwidthLatencyTest reached about 380 of NVLink 4's
  450 GB/s one way between two H100 SXM).
  The latencies are ASSUMED round figures, not measurements: RDMA_LATENCY_S for GPU-direct paths (NVLink, RDMA over
  InfiniBand), TCP_LATENCY_S for a TCP stack over Ethernet. They matter only for small messages; change them and see.
* The prefill is priced by lab 00's rule for the whole prompt (`calculators.forward_kernels` with rows L,
  L(L+1)/2 (query, key) pairs and L tokens of K/V written, timed by `calculators.kernels_time`), the same figure as
  `calculators.roofline_report(...)["prefill"].time_s` at batch 1. Each layer is taken to cost prefill_s / n_layers:
  the layers have one shape; the output projection's share (about 7% of Llama-3-8B's matmul FLOPs) is spread over them.
* Layer-wise sending (vLLM's KV connectors have a hook for it: `save_kv_layer`, "starts saving KV for layer i"):
  layer l's K/V can leave once layer l has computed, one message a layer, and the link carries one send at a time.
  With compute c_l = t_0 + ... + t_l the end of layer l's compute and x_l = alpha + bytes_l / B its send,
      start_l = max(c_l, end_{l-1}),   end_l = start_l + x_l,   end_{-1} = 0,
  and the transfer left exposed after the prefill is end_{N-1} - c_{N-1}. With equal layers (t, x):
      x <= t:  exposed = x                          (each send is done before the next layer's K/V is ready)
      x >  t:  exposed = x + (N - 1) * (x - t)      (the link is the bottleneck; the excess piles up)
  Sending the whole cache after the prefill instead costs alpha + bytes / B, all of it exposed.
* The first decode step is `calculators.decode_step_time` at context = the prompt (batch `decode_batch`): the
  decode GPU's step once the cache has arrived. A transfer shorter than that delays the request by less than one
  output token's time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from minigpt.longctx import kv_compression
from minigpt.longctx.kv_compression import KVLayout
from minigpt.costmodel import calculators as calc
from minigpt.costmodel.calculators import ModelShape
from minigpt.costmodel.hardware import Accelerator
from minigpt.costmodel.parallel_cost import INTERCONNECTS

__all__ = ["Link", "LINKS", "RDMA_LATENCY_S", "TCP_LATENCY_S", "gbit_per_s", "DEEPSEEK_V3_MLA", "kv_bytes_per_request",
           "transfer_time", "layer_send_ends", "exposed_after_compute", "OverlapReport", "layerwise_overlap",
           "transfer_table"]

KVShape = Union[ModelShape, KVLayout]

# ASSUMED per-message latencies (an assumption of the model, not a datasheet figure): a few microseconds for a
# GPU-direct copy or an RDMA write to complete, tens of microseconds through a TCP stack.
RDMA_LATENCY_S = 5e-6
TCP_LATENCY_S = 20e-6


def gbit_per_s(gigabits: float) -> float:
    """Bytes/s of a link rated at `gigabits` Gb/s (networks are rated in bits, decimal): gigabits * 1e9 / 8."""
    return gigabits * 1e9 / 8


@dataclass(frozen=True)
class Link:
    """A path the KV cache travels: bytes/s ONE WAY (decimal), a per-message latency in seconds, and where the
    bandwidth comes from (the latency is always an assumption, see RDMA_LATENCY_S and TCP_LATENCY_S)."""

    name: str
    bandwidth: float        # bytes/s, one direction
    latency_s: float        # alpha: fixed cost of one message
    source: str

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"Link {self.name!r}: bandwidth must be positive bytes/s, got {self.bandwidth!r}")
        if not self.latency_s >= 0:
            raise ValueError(f"Link {self.name!r}: latency_s must be >= 0 seconds, got {self.latency_s!r}")


# Bandwidths from the vendors' documents (line rates; what a transfer reaches is lower). NVLink's figure is lab 07's
# (`parallel_cost.INTERCONNECTS`), so the course holds it once.
LINKS: dict[str, Link] = {
    "NVLink 4 (H100 SXM)": Link(
        "NVLink 4 (H100 SXM)", INTERCONNECTS["NVLink 4"].bandwidth, RDMA_LATENCY_S,
        "NVIDIA H100 datasheet (H100 SXM column): NVLink 900 GB/s, both directions together, so 450 GB/s one way "
        "(lab 07's parallel_cost.INTERCONNECTS['NVLink 4']); within one NVLink domain (an 8-GPU HGX/DGX node)"),
    "InfiniBand NDR (1 port)": Link(
        "InfiniBand NDR (1 port)", gbit_per_s(400), RDMA_LATENCY_S,
        "NVIDIA networking docs: NDR InfiniBand line rate 400 Gb/s a port (QM97XX '1U NDR 400Gbps InfiniBand "
        "Switch Systems' user manual; MMA4Z00-NS transceiver page: 'line rate is 400Gb/s for ... NDR InfiniBand'); "
        "400e9 / 8 = 50 GB/s one way; one ConnectX-7 port, one GPU's NIC on a DGX H100"),
    "InfiniBand NDR x8 (DGX H100)": Link(
        "InfiniBand NDR x8 (DGX H100)", 8 * gbit_per_s(400), RDMA_LATENCY_S,
        "NVIDIA DGX BasePOD reference architecture, 'Core Components': DGX H100/H200 has 'eight single-port NVIDIA "
        "ConnectX-7 VPI ... up to 400 Gb/s InfiniBand/Ethernet' for the compute fabric: 8 x 50 GB/s = 400 GB/s one "
        "way, reached only when all eight NICs carry a share (e.g. a cache split over 8 tensor-parallel GPUs)"),
    "100 GbE": Link(
        "100 GbE", gbit_per_s(100), TCP_LATENCY_S,
        "IEEE 802.3 100 Gb/s Ethernet (802.3ba; 'IEEE 802.3-2018 ... 100GE Ethernet MAC rates', AMD PG314): "
        "100e9 / 8 = 12.5 GB/s one way; latency assumes TCP (RoCE would be RDMA_LATENCY_S)"),
    "25 GbE": Link(
        "25 GbE", gbit_per_s(25), TCP_LATENCY_S,
        "IEEE 802.3by 25 Gb/s Ethernet (25GBASE-R; 'IEEE 802.3-2018 ... 25GE Ethernet MAC rates', AMD PG314): "
        "25e9 / 8 = 3.125 GB/s one way; latency assumes TCP"),
}

# DeepSeek-V3's attention as its KV cache sees it. kv_compression.LAYOUTS holds DeepSeek-V2; V3 has the same MLA
# widths and 61 layers (deepseek-ai/DeepSeek-V3 config.json: num_hidden_layers 61, num_attention_heads 128,
# kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128). Lab 09's Q3 uses the same figures.
DEEPSEEK_V3_MLA = KVLayout("DeepSeek-V3 (MLA)", "MLA", n_layers=61, n_heads=128, n_kv_heads=128, head_dim=128,
                           kv_lora_rank=512, rope_dim=64,
                           source="deepseek-ai/DeepSeek-V3: kv_lora_rank 512, qk_rope_head_dim 64, 61 layers")


def _check_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_tokens(prompt_tokens: Any) -> None:
    if not isinstance(prompt_tokens, int) or isinstance(prompt_tokens, bool) or prompt_tokens < 0:
        raise ValueError(f"prompt_tokens must be a non-negative int, got {prompt_tokens!r}")


# ---------------------------------------------------------------- bytes and link time

def kv_bytes_per_request(shape_or_layout: KVShape, prompt_tokens: int, bytes_per_element: int = 2) -> int:
    """Bytes of the KV cache one request of `prompt_tokens` tokens leaves behind, all layers.

    ModelShape (dense MHA/GQA/MQA): calculators.kv_cache_bytes = 2 * n_layers * n_kv_heads * head_dim * T * bytes.
    KVLayout (any kind, MLA included): kv_compression.kv_bytes; for MLA
        n_layers * (kv_lora_rank + rope_dim) * T * bytes.
    `bytes_per_element` is a whole number of bytes (fp8 1, bf16 2, fp32 4); per-block scales are ignored.
    """
    _check_tokens(prompt_tokens)
    _check_positive_int("bytes_per_element", bytes_per_element)
    if isinstance(shape_or_layout, ModelShape):
        return calc.kv_cache_bytes(shape_or_layout, prompt_tokens, 1, bytes_per_element)
    if isinstance(shape_or_layout, KVLayout):
        return kv_compression.kv_bytes(shape_or_layout, prompt_tokens, 1, bytes_per_element)
    raise TypeError(f"expected a calculators.ModelShape or a kv_compression.KVLayout, "
                    f"got {type(shape_or_layout).__name__}")


def transfer_time(nbytes: float, link: Link, n_messages: int = 1) -> float:
    """Seconds to send `nbytes` over `link` as `n_messages` messages: n_messages * latency + nbytes / bandwidth."""
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    _check_positive_int("n_messages", n_messages)
    return n_messages * link.latency_s + nbytes / link.bandwidth


# ---------------------------------------------------------------- the layer-wise pipeline

def layer_send_ends(compute_s: Sequence[float], send_s: Sequence[float]) -> list[float]:
    """When each layer's send finishes, the clock starting with the prefill.

    compute_s[l]: seconds of layer l's compute; send_s[l]: seconds of its send (latency included). Layer l's send
    starts once its compute has ended AND the link is free: start_l = max(c_l, end_{l-1}) with c_l = sum of
    compute_s[0..l] and end_{-1} = 0; end_l = start_l + send_s[l].
    """
    if len(compute_s) != len(send_s) or not compute_s:
        raise ValueError(f"need one compute time and one send time per layer (at least one layer), got "
                         f"{len(compute_s)} and {len(send_s)}")
    if any(not t >= 0 for t in compute_s) or any(not x >= 0 for x in send_s):
        raise ValueError("compute and send times must be >= 0 seconds")
    ends, computed, link_free = [], 0.0, 0.0
    for t, x in zip(compute_s, send_s):
        computed += t
        link_free = max(computed, link_free) + x
        ends.append(link_free)
    return ends


def exposed_after_compute(compute_s: Sequence[float], send_s: Sequence[float]) -> float:
    """Seconds the layer-wise sends run on after the last layer's compute: end_{N-1} - c_{N-1} (never negative,
    since the last layer's send starts no earlier than its compute ends)."""
    last = layer_send_ends(compute_s, send_s)[-1]
    computed = 0.0
    for t in compute_s:            # summed in the same order as layer_send_ends, so the difference is exact at x = 0
        computed += t
    return max(0.0, last - computed)


@dataclass(frozen=True)
class OverlapReport:
    """One request's prefill, its KV transfer two ways, and the decode step that follows (seconds, bytes)."""

    model: str
    link: str
    prompt_tokens: int
    kv_bytes: int
    layer_bytes: int
    prefill_s: float                    # lab 00's rule for the whole prompt, batch 1
    compute_per_layer_s: float          # prefill_s / n_layers
    send_per_layer_s: float             # latency + layer_bytes / bandwidth
    transfer_after_prefill_s: float     # the whole cache as one message once the prefill has finished
    exposed_layerwise_s: float          # what the layer-wise sends add after the prefill
    first_decode_step_s: float          # calculators.decode_step_time at context = prompt

    @property
    def layerwise_saving_s(self) -> float:
        """Seconds that sending layer by layer saves over sending after the prefill (negative when the extra
        per-message latencies cost more than the overlap wins)."""
        return self.transfer_after_prefill_s - self.exposed_layerwise_s

    @property
    def whole_within_decode_step(self) -> bool:
        """Does the cache sent after the prefill take no longer than one decode step?"""
        return self.transfer_after_prefill_s <= self.first_decode_step_s

    @property
    def layerwise_within_decode_step(self) -> bool:
        """Does the exposed part of the layer-wise transfer take no longer than one decode step?"""
        return self.exposed_layerwise_s <= self.first_decode_step_s


def layerwise_overlap(shape: ModelShape, prompt_tokens: int, accelerator: Accelerator, link: Link,
                      bytes_per_element: int = 2, *, weight_bytes_per_element: float = 2, precision: str = "bf16",
                      decode_batch: int = 1) -> OverlapReport:
    """Prefill `prompt_tokens` on `accelerator`, send the KV cache over `link`, and compare (module docstring).

    prefill_s = kernels_time(forward_kernels(shape, L, L(L+1)/2, L)) at accelerator.peak(precision) and its memory
    bandwidth; each layer computes prefill_s / n_layers and sends kv_bytes / n_layers as one message.
    `bytes_per_element` is the KV cache's, `weight_bytes_per_element` the weights'.
    """
    if not isinstance(shape, ModelShape):
        raise TypeError(f"layerwise_overlap prices the prefill on lab 00's roofline, which needs a calculators."
                        f"ModelShape, got {type(shape).__name__}")
    _check_positive_int("prompt_tokens", prompt_tokens)
    _check_positive_int("decode_batch", decode_batch)
    kv = kv_bytes_per_request(shape, prompt_tokens, bytes_per_element)
    peak, bandwidth = accelerator.peak(precision), accelerator.memory_bandwidth
    kw = dict(weight_bytes_per_element=weight_bytes_per_element, kv_bytes_per_element=bytes_per_element)
    kernels = calc.forward_kernels(shape, prompt_tokens, prompt_tokens * (prompt_tokens + 1) // 2, prompt_tokens, **kw)
    prefill_s = calc.kernels_time(kernels, peak, bandwidth)
    n = shape.n_layers
    layer_bytes = kv // n
    per_layer, send = prefill_s / n, transfer_time(layer_bytes, link)
    return OverlapReport(
        model=shape.name, link=link.name, prompt_tokens=prompt_tokens, kv_bytes=kv, layer_bytes=layer_bytes,
        prefill_s=prefill_s, compute_per_layer_s=per_layer, send_per_layer_s=send,
        transfer_after_prefill_s=transfer_time(kv, link),
        exposed_layerwise_s=exposed_after_compute([per_layer] * n, [send] * n),
        first_decode_step_s=calc.decode_step_time(shape, prompt_tokens, decode_batch, peak, bandwidth, **kw))


# ---------------------------------------------------------------- a table for the notebook

def transfer_table(shapes: Iterable[KVShape] | Mapping[str, KVShape], prompt_lengths: Iterable[int],
                   links: Iterable[Link] | Mapping[str, Link], accelerator: Accelerator, *,
                   bytes_per_element: int = 2, precision: str = "bf16") -> list[dict[str, Any]]:
    """One row per (model, prompt length, link): the cache's bytes, its transfer after the prefill, and for a
    ModelShape the prefill, the exposed layer-wise transfer and the first decode step on `accelerator`.

    A KVLayout (an MLA model, say) has no roofline shape here, so its timing columns other than transfer_s are None.
    """
    shapes = list(shapes.values()) if isinstance(shapes, Mapping) else list(shapes)
    links = list(links.values()) if isinstance(links, Mapping) else list(links)
    lengths = list(prompt_lengths)
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        kind = shape.attention_kind if isinstance(shape, ModelShape) else shape.kind
        for tokens in lengths:
            kv = kv_bytes_per_request(shape, tokens, bytes_per_element)
            for link in links:
                row: dict[str, Any] = {"model": shape.name, "attention": kind, "prompt_tokens": tokens,
                                       "link": link.name, "kv_bytes": kv, "kv_MiB": kv / 2**20,
                                       "transfer_s": transfer_time(kv, link), "prefill_s": None,
                                       "exposed_layerwise_s": None, "first_decode_step_s": None,
                                       "layerwise_within_decode_step": None}
                if isinstance(shape, ModelShape) and tokens > 0:
                    r = layerwise_overlap(shape, tokens, accelerator, link, bytes_per_element, precision=precision)
                    row.update(prefill_s=r.prefill_s, exposed_layerwise_s=r.exposed_layerwise_s,
                               first_decode_step_s=r.first_decode_step_s,
                               layerwise_within_decode_step=r.layerwise_within_decode_step)
                rows.append(row)
    return rows
