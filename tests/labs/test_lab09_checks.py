"""Lab 09 checks: the solution notebook's answers pass; the stub, the package's own reference handed in (itself, a
subclass inheriting its methods, a thin wrapper that calls it) and each plausible wrong implementation fail with a
message that names the exercise and the mistake.

Costs about 25 s on the shared 2-core machine (one test starts a second Python as the learner's kernel)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from autograder import lab09
from autograder.checking.reference_guard import ReferenceHandedIn
from autograder.checking.replayed_ranks import ReplayBackend
from autograder.checking.wire import RemoteError
from minigpt.kernels.paged_decode import merge_partials
from minigpt.longctx import kv_compression as kvc
from minigpt.longctx import mla
from minigpt.longctx.eviction import snapkv_keep
from minigpt.longctx.ring_attention import block_attention, ring_attention, ring_bytes_per_rank, ring_pass
from minigpt.longctx.rope_scaling import base_inv_freq, rotations_in_context, scaled_inv_freq
from minigpt.longctx.sliding_window import RingKVCache, kept_positions, rotate_keys
from minigpt.parallel.comm import CountingComm
from tests.labs.judged import learner_process
from tests.labs.judged_pair import judged
from tests.labs.notebook_solutions import solution_cells

# The solution notebook's answers, compiled as notebook code (the checks refuse the package's own objects).
SOLUTION = solution_cells("09_long_context", "ex1_code", "ex2_code", "ex4_code", "ex5_code", "ex6_code", "ex7_code",
                          "ex8_code",
                          preamble="""
import math
import torch
from minigpt.kernels.paged_decode import merge_partials
from minigpt.longctx import ring_attention as ra, sliding_window as sw
from minigpt.parallel.comm import CountingComm
""")
my_scaled_inv_freq = SOLUTION["scaled_inv_freq"]
MyRingKVCache = SOLUTION["RingKVCache"]
my_kv_bytes = SOLUTION["kv_bytes_per_token"]
my_absorbed_decode = SOLUTION["absorbed_decode"]
my_snapkv_keep = SOLUTION["snapkv_keep"]
my_ring_attention = SOLUTION["ring_attention"]
my_ring_bytes = SOLUTION["ring_bytes_per_rank"]


def stub(*args, **kwargs):
    raise NotImplementedError


def test_the_solution_passes() -> None:
    lab09.check_scaled_inv_freq(my_scaled_inv_freq)
    lab09.check_ring_cache(MyRingKVCache)
    lab09.check_sink_cache(MyRingKVCache)
    lab09.check_kv_bytes(my_kv_bytes)
    lab09.check_mla_absorbed_decode(my_absorbed_decode)
    lab09.check_snapkv_keep(my_snapkv_keep)
    lab09.check_ring_attention(my_ring_attention)
    lab09.check_ring_bytes(my_ring_bytes)


@pytest.mark.parametrize("check", [lab09.check_scaled_inv_freq, lab09.check_kv_bytes, lab09.check_mla_absorbed_decode,
                                   lab09.check_snapkv_keep,
                                   lab09.check_ring_attention, lab09.check_ring_bytes])
def test_stub_fails(check) -> None:
    with pytest.raises(AssertionError, match="not implemented"):
        check(stub)


# --- the package's reference is refused: itself, a subclass inheriting its methods, a thin wrapper ----------

class InheritingCache(RingKVCache):
    pass


class DelegatingCache:
    """Every method hands the work to the package's RingKVCache."""

    def __init__(self, *args):
        self.inner = RingKVCache(*args)

    @property
    def length(self):
        return self.inner.length

    @property
    def nbytes(self):
        return self.inner.nbytes

    def next_positions(self, n):
        return self.inner.next_positions(n)

    def slot(self, position):
        return self.inner.slot(position)

    def update(self, k, v):
        return self.inner.update(k, v)

    def read(self):
        return self.inner.read()


class SuperCache(RingKVCache):
    """Defines each method the exercise asks for, as a call of the reference's."""

    def next_positions(self, n):
        return super().next_positions(n)

    def slot(self, position):
        return super().slot(position)

    def update(self, k, v):
        return super().update(k, v)

    def read(self):
        return super().read()


def wrapped_scaled_inv_freq(head_dim, theta, factor, method, original_max_len):
    return scaled_inv_freq(head_dim, theta, factor, method, original_max_len)


def wrapped_kv_bytes(kind, n_layers, n_heads, n_kv_heads, head_dim, bytes_per_element, kv_lora_rank=0, rope_dim=0):
    return kvc.kv_bytes_per_token(kind, n_layers, n_heads, n_kv_heads, head_dim, bytes_per_element, kv_lora_rank,
                                  rope_dim)


def per_layer_from_the_package(kind, n_layers, n_heads, n_kv_heads, head_dim, bytes_per_element, kv_lora_rank=0,
                               rope_dim=0):
    """Half a wrapper: the per-layer count is the package's."""
    return n_layers * bytes_per_element * kvc.kv_elements_per_token_layer(kind, n_heads, n_kv_heads, head_dim,
                                                                          kv_lora_rank, rope_dim)


def wrapped_absorbed_decode(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o):
    return mla.absorbed_decode(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o)


def materialised_by_the_package(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o):
    """The package's materialised path handed in as the absorbed one."""
    return mla.naive_decode(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o)


def wrapped_snapkv_keep(obs_scores, budget, obs_window):
    return snapkv_keep(obs_scores, budget, obs_window)


def wrapped_ring_attention(comm, q, k, v):
    return ring_attention(comm, q, k, v)


def wrapped_ring_bytes(seq_len, world_size, batch, n_kv_heads, head_dim, bytes_per_element):
    return ring_bytes_per_rank(seq_len, world_size, batch, n_kv_heads, head_dim, bytes_per_element)


HANDED_IN = [(lab09.check_scaled_inv_freq, scaled_inv_freq, lab09.EX1),
             (lab09.check_ring_cache, RingKVCache, lab09.EX2),
             (lab09.check_sink_cache, RingKVCache, lab09.EX3),
             (lab09.check_kv_bytes, kvc.kv_bytes_per_token, lab09.EX4),
             (lab09.check_mla_absorbed_decode, mla.absorbed_decode, lab09.EX5),
             (lab09.check_mla_absorbed_decode, mla.naive_decode, lab09.EX5),
             (lab09.check_snapkv_keep, snapkv_keep, lab09.EX6),
             (lab09.check_ring_attention, ring_attention, lab09.EX7),
             (lab09.check_ring_bytes, ring_bytes_per_rank, lab09.EX8)]


@pytest.mark.parametrize("check, reference, exercise", HANDED_IN, ids=[f"{e}-{r.__name__}" for _, r, e in HANDED_IN])
def test_the_package_reference_handed_in_is_refused(check, reference, exercise) -> None:
    with pytest.raises(ReferenceHandedIn, match=rf"^{re.escape(exercise)}: this is the course's reference"):
        check(reference)


@pytest.mark.parametrize("check, exercise", [(lab09.check_ring_cache, lab09.EX2), (lab09.check_sink_cache, lab09.EX3)])
def test_a_subclass_inheriting_the_cache_methods_is_refused(check, exercise) -> None:
    with pytest.raises(ReferenceHandedIn, match=rf"^{re.escape(exercise)}: InheritingCache inherits next_positions, "
                                                r"slot, update, read from the course's reference"):
        check(InheritingCache)


WRAPPERS = [(lab09.check_scaled_inv_freq, wrapped_scaled_inv_freq, lab09.EX1, "scaled_inv_freq"),
            (lab09.check_ring_cache, DelegatingCache, lab09.EX2, "RingKVCache.__init__"),
            (lab09.check_ring_cache, SuperCache, lab09.EX2, "RingKVCache.__init__"),
            (lab09.check_sink_cache, DelegatingCache, lab09.EX3, "RingKVCache.__init__"),
            (lab09.check_kv_bytes, wrapped_kv_bytes, lab09.EX4, "kv_bytes_per_token"),
            (lab09.check_kv_bytes, per_layer_from_the_package, lab09.EX4, "kv_elements_per_token_layer"),
            (lab09.check_mla_absorbed_decode, wrapped_absorbed_decode, lab09.EX5, "absorbed_decode"),
            (lab09.check_mla_absorbed_decode, materialised_by_the_package, lab09.EX5, "naive_decode"),
            (lab09.check_snapkv_keep, wrapped_snapkv_keep, lab09.EX6, "snapkv_keep"),
            (lab09.check_ring_attention, wrapped_ring_attention, lab09.EX7, "ring_attention"),
            (lab09.check_ring_bytes, wrapped_ring_bytes, lab09.EX8, "ring_bytes_per_rank")]


@pytest.mark.parametrize("check, wrapper, exercise, entered", WRAPPERS,
                         ids=[f"{e}-{w.__name__}" for _, w, e, _ in WRAPPERS])
def test_a_thin_wrapper_around_the_reference_is_refused(check, wrapper, exercise, entered) -> None:
    with pytest.raises(ReferenceHandedIn, match=rf"^{re.escape(exercise)}: your code calls the course's reference "
                                                rf"\({re.escape(entered)}\)"):
        check(wrapper)


def test_a_judged_wrapper_is_refused_in_the_kernel() -> None:
    """Given Remotes (the judge), the watch travels with each call and the kernel's side refuses the wrapper; each
    rank of ring attention is a call the judge makes, under the same watch."""
    with judged(freq=wrapped_scaled_inv_freq, ring=wrapped_ring_attention, good=my_scaled_inv_freq) as learner:
        lab09.check_scaled_inv_freq(learner.good)
        # the kernel's watch raises ReferenceHandedIn there; the judge takes none of the grader's exception types
        # from the kernel, so it arrives as a RemoteError that the check turns into its failure, the message kept
        with pytest.raises(AssertionError, match=rf"{re.escape(lab09.EX1)}: your code calls the course's reference"):
            lab09.check_scaled_inv_freq(learner.freq)
        with pytest.raises((AssertionError, RemoteError),
                           match=rf"{re.escape(lab09.EX7)}: your code calls the course's reference"):
            lab09.check_ring_attention(learner.ring)


# --- 1. RoPE scaling ---------------------------------------------------------------------------------------

def yarn_on_the_wrong_half(head_dim, theta, factor, method, original_max_len):
    """The ramp reversed: the fast pairs interpolated, the slow ones kept."""
    if method != "yarn":
        return my_scaled_inv_freq(head_dim, theta, factor, method, original_max_len)
    f = base_inv_freq(head_dim, theta)
    g = ((rotations_in_context(f, original_max_len) - 1) / 31).clamp(0, 1)
    return g * f / factor + (1 - g) * f


def ntk_without_the_exponent(head_dim, theta, factor, method, original_max_len):
    if method != "ntk":
        return my_scaled_inv_freq(head_dim, theta, factor, method, original_max_len)
    return base_inv_freq(head_dim, theta * factor)


def yarn_by_pair_index(head_dim, theta, factor, method, original_max_len):
    """Transformers' ramp, linear in the pair index between the floored and ceiled correction dimensions."""
    if method != "yarn":
        return my_scaled_inv_freq(head_dim, theta, factor, method, original_max_len)
    f = base_inv_freq(head_dim, theta)
    dim = lambda turns: head_dim * math.log(original_max_len / (2 * math.pi * turns)) / (2 * math.log(theta))
    low, high = max(math.floor(dim(32)), 0), min(math.ceil(dim(1)), head_dim - 1)
    keep = 1 - ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return (1 - keep) * f / factor + keep * f


def yarn_ramp_over_index_without_rounding(head_dim, theta, factor, method, original_max_len):
    """The index ramp between the unrounded correction dimensions: neither convention."""
    if method != "yarn":
        return my_scaled_inv_freq(head_dim, theta, factor, method, original_max_len)
    f = base_inv_freq(head_dim, theta)
    dim = lambda turns: head_dim * math.log(original_max_len / (2 * math.pi * turns)) / (2 * math.log(theta))
    keep = 1 - ((torch.arange(head_dim // 2, dtype=torch.float64) - dim(32)) / (dim(1) - dim(32))).clamp(0, 1)
    return (1 - keep) * f / factor + keep * f


def test_transformers_yarn_ramp_is_accepted() -> None:
    lab09.check_scaled_inv_freq(yarn_by_pair_index)


@pytest.mark.parametrize("wrong, message", [(yarn_on_the_wrong_half, "wrong half of the dimensions"),
                                            (ntk_without_the_exponent, "theta' = theta"),
                                            (yarn_ramp_over_index_without_rounding, "Transformers' ramp")])
def test_wrong_frequency_transforms_fail(wrong, message) -> None:
    with pytest.raises(AssertionError, match=message):
        lab09.check_scaled_inv_freq(wrong)


# --- 2-3. The ring-buffer cache ----------------------------------------------------------------------------

class ReusesPositionsAfterWrap(MyRingKVCache):
    """Hands out slot numbers as positions: after the first wrap-around they start again from the sinks."""

    def next_positions(self, n):
        return torch.tensor([self.slot(p) for p in range(self.length, self.length + n)])


class EvictsSinksWithTheWindow(MyRingKVCache):
    """A plain ring of n_sinks + window slots: the first tokens are overwritten like any other."""

    def slot(self, position):
        return position % self.capacity

    def read(self):
        n, cap = self.length, self.capacity
        positions = list(range(max(0, n - cap), n))
        return self.k[:, [self.slot(p) for p in positions]], self.v[:, [self.slot(p) for p in positions]]


class GrowsWithTheStream(MyRingKVCache):
    """Correct logits, but reallocates a bigger buffer on every token: memory is not fixed."""

    def update(self, k, v):
        out = super().update(k, v)
        self.k = torch.cat([self.k, torch.zeros_like(self.k[:, :1])], 1)
        self.v = torch.cat([self.v, torch.zeros_like(self.v[:, :1])], 1)
        return out


class AcceptsAnyChunk(MyRingKVCache):
    def update(self, k, v):
        for t in range(k.shape[1]):
            out = super().update(k[:, t:t + 1], v[:, t:t + 1])
        return out


def test_positions_reused_after_wrap_around_fail() -> None:
    with pytest.raises(AssertionError, match="first wrap-around"):
        lab09.check_ring_cache(ReusesPositionsAfterWrap)


def test_sinks_evicted_with_the_window_fail() -> None:
    lab09.check_ring_cache(EvictsSinksWithTheWindow)            # without sinks it is a correct window cache
    with pytest.raises(AssertionError, match="never a sink"):
        lab09.check_sink_cache(EvictsSinksWithTheWindow)


def test_a_growing_cache_fails() -> None:
    with pytest.raises(AssertionError, match="fixed"):
        lab09.check_ring_cache(GrowsWithTheStream)


def test_a_chunk_that_would_evict_must_be_refused() -> None:
    with pytest.raises(AssertionError, match="must raise ValueError"):
        lab09.check_ring_cache(AcceptsAnyChunk)


class SinksNotRotated(MyRingKVCache):
    def read(self):
        slots = [self.slot(p) for p in kept_positions(self.length, self.window, self.n_sinks)]
        return self.k[:, slots], self.v[:, slots]


class SinksRotatedOneTooFar(MyRingKVCache):
    """The sinks rotated on by shift + 1: off by one position (on the unscaled tiny model the logits moved by 7.9e-5
    to 2.8e-4, against a tolerance of 1e-4)."""

    def read(self):
        k, v = super().read()
        if self.n_sinks and self.length - self.window - self.n_sinks > 0:
            k = torch.cat([rotate_keys(k[:, :self.n_sinks], 1, self.inv_freq), k[:, self.n_sinks:]], dim=1)
        return k, v


def test_sinks_rotated_one_position_too_far_fail_in_every_case() -> None:
    for window, sinks, T, prefill in ((8, 2, 40, 6), (5, 4, 30, 1), (6, 1, 25, 7)):
        with pytest.raises(AssertionError, match="logits differ") as info:
            lab09._stream_check(SinksRotatedOneTooFar, window, sinks, T, prefill, "case", lab09.EX3)
        error = float(re.search(r"by up to ([0-9.e+-]+)", str(info.value)).group(1))
        assert error > 10 * lab09.ATOL            # a margin, not a hair past the tolerance


class ChecksRoomOnlyOnceStarted(MyRingKVCache):
    """Refuses an oversized chunk only when the cache already holds tokens: a long prefill into an empty ring is
    accepted, and its first queries attend to evicted keys."""

    def update(self, k, v):
        if self.length == 0 and k.shape[1] > self.capacity:
            for t in range(k.shape[1]):
                super().update(k[:, t:t + 1], v[:, t:t + 1])
            return self.read()
        return super().update(k, v)


def test_a_prefill_longer_than_the_ring_into_an_empty_cache_is_refused() -> None:
    with pytest.raises(AssertionError, match="EMPTY window of 4"):
        lab09.check_ring_cache(ChecksRoomOnlyOnceStarted)


def test_sinks_left_at_their_old_positions_fail() -> None:
    with pytest.raises(AssertionError, match="rotated on by shift"):
        lab09.check_sink_cache(SinksNotRotated)


# --- 4-6. KV bytes, MLA's absorbed decode and SnapKV --------------------------------------------------------------------------

def mla_caches_two_latents(kind, n_layers, n_heads, n_kv_heads, head_dim, bpe, kv_lora_rank=0, rope_dim=0):
    if kind == "MLA":
        return n_layers * bpe * 2 * (kv_lora_rank + rope_dim)
    return my_kv_bytes(kind, n_layers, n_heads, n_kv_heads, head_dim, bpe)


def test_mla_with_two_latents_fails() -> None:
    with pytest.raises(AssertionError, match="ONE latent"):
        lab09.check_kv_bytes(mla_caches_two_latents)


def _absorbed(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, *, transpose=True, rope=True, scale_dim=None):
    """The absorbed step with one of the plausible mistakes switched on."""
    d_n, d_r = w_uk.shape[-1], q_rope.shape[-1]
    q_latent = torch.einsum("bhd,hrd->bhr" if transpose else "bhd,hdr->bhr", q_nope, w_uk)
    scores = q_latent @ c_kv.transpose(1, 2) + (q_rope @ k_rope.transpose(1, 2) if rope else 0.0)
    scores = scores / math.sqrt(scale_dim(d_n, d_r) if scale_dim else d_n + d_r)
    o = torch.einsum("bhr,hrv->bhv", scores.softmax(-1) @ c_kv, w_uv)
    return o.flatten(1) @ w_o


def w_uk_folded_without_transpose(*args):
    return _absorbed(*args, transpose=False)


def rope_part_forgotten(*args):
    return _absorbed(*args, rope=False)


def scaled_by_the_nope_width_only(*args):
    return _absorbed(*args, scale_dim=lambda d_n, d_r: d_n)


def materialised_by_hand(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o):
    """Per-token K and V for every head, written out: right outputs; the check cannot see the difference."""
    B, T, H = c_kv.shape[0], c_kv.shape[1], w_uk.shape[0]
    k = torch.cat([torch.einsum("btr,hrd->bhtd", c_kv, w_uk), k_rope[:, None].expand(B, H, T, -1)], -1)
    v = torch.einsum("btr,hrd->bhtd", c_kv, w_uv)
    q = torch.cat([q_nope, q_rope], -1)[:, :, None]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)[:, :, 0].flatten(1) @ w_o


@pytest.mark.parametrize("wrong, message", [
    (w_uk_folded_without_transpose, "W_UK is folded without its transpose"),
    (rope_part_forgotten, "leave out the decoupled RoPE part"),
    (scaled_by_the_nope_width_only, r"1/sqrt\(nope_dim \+ rope_dim\).*not 1/sqrt\(nope_dim\)"),
])
def test_wrong_absorbed_decodes_fail_saying_why(wrong, message) -> None:
    with pytest.raises(AssertionError, match=rf"^{re.escape(lab09.EX5)}, .*differs from the materialised path.*{message}"):
        lab09.check_mla_absorbed_decode(wrong)


def test_a_hand_written_materialised_decode_is_not_observed() -> None:
    """What the check cannot see (said in its docstring and the notebook): per-token K and V formed by the learner's
    own code give the same outputs. Kept as a test so that a future observation of it changes this on purpose."""
    lab09.check_mla_absorbed_decode(materialised_by_hand)


def test_each_mla_seed_draws_other_inputs_and_the_package_paths_agree() -> None:
    first = lab09._mla_inputs(lab09.MLA_CASES[0], 1)
    assert not torch.equal(first[0], lab09._mla_inputs(lab09.MLA_CASES[0], 2)[0])
    assert (mla.absorbed_decode(*first) - mla.naive_decode(*first)).abs().max() < lab09.MLA_ATOL


def snapkv_forgets_the_observation_window(obs_scores, budget, obs_window):
    return obs_scores.sum(1).topk(budget, -1).indices.sort(-1).values


def test_snapkv_without_the_observation_window_fails() -> None:
    with pytest.raises(AssertionError, match="observation window itself"):
        lab09.check_snapkv_keep(snapkv_forgets_the_observation_window)


# --- 6-7. Ring attention -----------------------------------------------------------------------------------

def merge_without_lse(comm, q, k, v):
    n, r = comm.world_size, comm.rank
    outs = []
    for step in range(n):
        src = (r - step) % n
        if src <= r:
            outs.append(block_attention(q, k, v, causal=src == r)[0])
        if step < n - 1:
            k, v = ring_pass(comm, k), ring_pass(comm, v)
    return torch.stack(outs).mean(0)


def causal_skip_on_the_wrong_ranks(comm, q, k, v):
    n, r = comm.world_size, comm.rank
    outs, lses = [], []
    for step in range(n):
        src = (r - step) % n
        if src >= r:                                       # keeps the future, drops the past
            o, lse = block_attention(q, k, v, causal=src == r)
            outs.append(o)
            lses.append(lse)
        if step < n - 1:
            k, v = ring_pass(comm, k), ring_pass(comm, v)
    return merge_partials(torch.stack(outs, -2), torch.stack(lses, -1))


def test_merging_without_lse_weights_fails() -> None:
    with pytest.raises(AssertionError, match="averaged"):
        lab09.check_ring_attention(merge_without_lse)


def test_causal_block_skipped_on_the_wrong_ranks_fails() -> None:
    with pytest.raises(AssertionError, match="src > r not at all"):
        lab09.check_ring_attention(causal_skip_on_the_wrong_ranks)


def own_block_passed_every_step(comm, q, k, v):
    """Passes its OWN K/V block at every step instead of the one it received: every rank sees only its left
    neighbour's block, over and over."""
    n, r = comm.world_size, comm.rank
    outs, lses = [], []
    held_k, held_v = k, v
    for step in range(n):
        src = (r - step) % n
        if src <= r:
            o, lse = block_attention(q, held_k, held_v, causal=src == r)
            outs.append(o)
            lses.append(lse)
        if step < n - 1:
            held_k, held_v = ring_pass(comm, k), ring_pass(comm, v)
    return merge_partials(torch.stack(outs, -2), torch.stack(lses, -1))


def test_passing_on_the_own_block_instead_of_the_received_one_fails() -> None:
    with pytest.raises(AssertionError, match="differs from full causal attention"):
        lab09.check_ring_attention(own_block_passed_every_step)


_KEPT: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def blocks_kept_between_rank_calls(comm, q, k, v):
    """The ranks are called one after another in one process: each call leaves its K/V block in a module global and
    attends over the blocks the earlier ranks left there, calling ring_pass only for the counts. It attends over what
    ring_pass returned only when that is its own block again (the grader's first round), so that round looks right."""
    n, r = comm.world_size, comm.rank
    _KEPT[r] = (k.clone(), v.clone())
    held = [(k, v)]
    for _ in range(n - 1):
        k, v = ring_pass(comm, k), ring_pass(comm, v)
        held.append((k, v))
    own = all(torch.equal(hk, held[0][0]) for hk, _ in held)
    blocks = held if own or any(s not in _KEPT for s in range(r + 1)) else [_KEPT[(r - s) % n] for s in range(n)]
    parts = [block_attention(q, bk, bv, causal=s == 0) for s, (bk, bv) in enumerate(blocks) if (r - s) % n <= r]
    return merge_partials(torch.stack([o for o, _ in parts], -2), torch.stack([lse for _, lse in parts], -1))


def test_blocks_kept_from_earlier_rank_calls_instead_of_passed_fail() -> None:
    """Right on every rank once the ring has settled, with 2 (n - 1) passes; refused because in a round where the
    grader handed other blocks on purpose the output is not the attention over them."""
    _KEPT.clear()
    with pytest.raises(AssertionError, match="not the attention over the K/V blocks ring_pass handed"):
        lab09.check_ring_attention(blocks_kept_between_rank_calls)


def every_block_gathered(comm, q, k, v):
    """Gathers the whole sequence's K and V on every rank (all_gather), then passes blocks only to be counted."""
    n, r = comm.world_size, comm.rank
    keys, values = comm.all_gather(k, dim=2).chunk(n, dim=2), comm.all_gather(v, dim=2).chunk(n, dim=2)
    for _ in range(n - 1):
        k, v = ring_pass(comm, k), ring_pass(comm, v)
    parts = [block_attention(q, keys[s], values[s], causal=s == r) for s in range(r + 1)]
    return merge_partials(torch.stack([o for o, _ in parts], -2), torch.stack([lse for _, lse in parts], -1))


def test_gathering_every_block_fails() -> None:
    with pytest.raises(AssertionError, match="ring_pass only"):
        lab09.check_ring_attention(every_block_gathered)


def prescaled_keys_passed(comm, q, k, v):
    """Scales its keys by 1/sqrt(D) once and passes the scaled block around: the right output, but what travels is
    not the K block, so the grader cannot tell what each step attended over."""
    n, r = comm.world_size, comm.rank
    k = k / math.sqrt(q.shape[-1])
    outs, lses = [], []
    for step in range(n):
        src = (r - step) % n
        if src <= r:
            o, lse = block_attention(q, k * math.sqrt(q.shape[-1]), v, causal=src == r)
            outs.append(o)
            lses.append(lse)
        if step < n - 1:
            k, v = ring_pass(comm, k), ring_pass(comm, v)
    return merge_partials(torch.stack(outs, -2), torch.stack(lses, -1))


def test_a_transformed_block_passed_around_is_refused_saying_so() -> None:
    with pytest.raises(AssertionError, match="neither the K block nor the V block"):
        lab09.check_ring_attention(prescaled_keys_passed)


def test_the_ranks_get_the_judges_communicator_and_it_counts() -> None:
    """Every rank's call gets the check's own CountingComm, whose ring passes the check answers: the count is its
    record of requests it served, not a number the ranks report."""
    seen = []

    def recording(comm, q, k, v):
        seen.append(comm)
        return my_ring_attention(comm, q, k, v)
    lab09.check_ring_attention(recording)
    assert seen and all(type(c) is CountingComm and type(c.backend) is ReplayBackend for c in seen)
    assert {c.world_size for c in seen} == {n for n, _ in lab09.RING_CASES}


def forge_the_kernel_side() -> None:
    """What a notebook cell can do in its own kernel: replace lab 09's rank runner there (the check used to run the
    ranks in the kernel through it) by one that reports what right ranks would: one process's causal attention,
    split by rank, with 2 (n - 1) ring passes each."""
    import autograder.lab09 as kernel_lab09
    from minigpt.attention import naive_attention

    def forged(fn, n, q, k, v, backend, **options):
        sent = 2 * (n - 1) * k.numel() // n * k.element_size()
        return [(b.clone(), {"ring_send": 2 * (n - 1)}, {"ring_send": sent})
                for b in naive_attention(q, k, v).chunk(n, dim=2)]
    kernel_lab09.ring_outputs = forged


def own_block_only(comm, q, k, v):
    """No ring at all: each rank attends over its own block."""
    return block_attention(q, k, v, causal=True)[0]


def test_a_rank_runner_forged_in_the_kernel_earns_nothing() -> None:
    """The kernel is a second process here, so what it patches is its own: the judge never asks it to run ranks."""
    module = __name__ if __name__.startswith("tests.") else "tests.labs.test_lab09_checks"
    with learner_process(module, ["forge_the_kernel_side", "own_block_only", "my_ring_attention"]) as learner:
        learner["forge_the_kernel_side"]()
        with pytest.raises(AssertionError, match="rank 0 called ring_pass 0 times"):
            lab09.check_ring_attention(learner["own_block_only"])
        lab09.check_ring_attention(learner["my_ring_attention"])


def ring_bytes_n_steps(seq_len, world_size, batch, n_kv_heads, head_dim, bpe):
    return world_size * 2 * batch * n_kv_heads * (seq_len // world_size) * head_dim * bpe


def test_ring_bytes_with_n_steps_fails() -> None:
    with pytest.raises(AssertionError, match="n - 1 steps"):
        lab09.check_ring_bytes(ring_bytes_n_steps)


# --- interview questions -----------------------------------------------------------------------------------

def test_interview_answers() -> None:
    f40 = 10_000.0 ** (-80 / 128)
    r = 4096 * f40 / (2 * math.pi)                           # 2.06 turns in the trained context: inside the ramp
    gamma = (r - 1) / 31
    lab09.check_q1_yarn_turns(32768 * f40 * ((1 - gamma) / 8 + gamma) / (2 * math.pi))
    for wrong, why in [(32768 * f40 / (2 * math.pi), "YaRN changes this pair"), (r, "inside the ramp"),
                       (4096 * f40 * ((1 - gamma) / 8 + gamma) / (2 * math.pi), "extended 32,768"),
                       (32768 * f40 * ((1 - gamma) / 8 + gamma), "2 pi radians")]:
        with pytest.raises(AssertionError, match=why):
            lab09.check_q1_yarn_turns(wrong)
    lab09.check_q2_window_streams(40 * 2**30 // (2 * 32 * 8 * 128 * 2 * 4100))
    lab09.check_q3_mla_requests(int((8 * 141e9 - 671e9) // (61 * 576 * 32768)))
    lab09.check_q4_ring_overlap(2 * 8 * 2 * 989.5e12 / (4 * 32 * 450e9))
    with pytest.raises(AssertionError, match="full caches"):
        lab09.check_q2_window_streams(2)
    for wrong, why in [(int(8 * 141e9 // (61 * 576 * 32768)), "weights take their share"),
                       (int((8 * 141e9 - 671e9) // (61 * 512 * 32768)), "decoupled RoPE"),
                       (int((8 * 141e9 - 671e9) // (61 * 576 * 2 * 32768)), "not bf16's 2"),
                       (int((8 * 141 * 2**30 - 671e9) // (61 * 576 * 32768)), "GB, not GiB"),
                       (397, "is not right")]:
        with pytest.raises(AssertionError, match=why):
            lab09.check_q3_mla_requests(wrong)
    with pytest.raises(AssertionError, match="K AND V.* Or: .*450 GB/s one way"):
        lab09.check_q4_ring_overlap(2 * 8 * 2 * 989.5e12 / (4 * 32 * 900e9))
