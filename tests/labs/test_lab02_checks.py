"""Lab 02 checks: the reference passes, the stub and each plausible wrong implementation fail."""

from __future__ import annotations

import math

import pytest
import torch

from autograder import lab02
from minigpt.cache.block_manager import BlockManager, Reservation
from minigpt.cache.block_pool import BlockPool, OutOfBlocks
from minigpt.cache.block_table import blocks_needed, slot_of
from minigpt.cache.paged_attention import gather_kv, paged_attention, paged_decode_attention
from minigpt.cache.prefix_cache import PrefixCache, hash_block
from minigpt.cache import paged_attention as paged_module

from autograder.checking.reference_guard import ReferenceHandedIn
from tests.labs.learner_copy import as_learner

EXAMPLES = 40       # enough for every wrong manager below to be caught (each fails within a few examples)

# The package's references re-typed as notebook code (the checks refuse the package's own objects).
LearnerBlockPool = as_learner(BlockPool)
LearnerBlockManager = as_learner(BlockManager, BlockPool=LearnerBlockPool)
learner_slot_of = as_learner(slot_of)
learner_hash_block = as_learner(hash_block)
learner_gather_kv = as_learner(gather_kv)
_paged_helpers = {"gather_kv": learner_gather_kv, "_check": as_learner(paged_module._check)}
learner_paged_decode_attention = as_learner(paged_decode_attention, **_paged_helpers)
learner_paged_attention = as_learner(paged_attention, **_paged_helpers)


def _stub(*args, **kwargs):
    raise NotImplementedError()


class StubPool:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError()


def reference_manager(num_blocks, block_size, prefix):
    """The reference's code, typed into the notebook."""
    return LearnerBlockManager(num_blocks, block_size, enable_prefix_caching=prefix)


def factory(manager_cls):
    return lambda n, bs, prefix: manager_cls(n, bs, enable_prefix_caching=prefix)


def with_pool(pool_cls):
    """A reference BlockManager over another pool class."""
    class Manager(LearnerBlockManager):
        def __init__(self, num_blocks, block_size, *, enable_prefix_caching=False):
            super().__init__(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching)
            self.pool = pool_cls(num_blocks, block_size)
            self.prefix_cache = PrefixCache(self.pool) if enable_prefix_caching else None
    return Manager


# --- wrong pools --------------------------------------------------------------------------------

class NoDecrementPool(LearnerBlockPool):
    """free() returns the block to the pool at once, without decrementing its ref_count."""

    def free(self, block, *, keep=False):
        if block in self._free:
            raise ValueError(f"block {block} is already free")
        self._free[block] = None


class FreeSharedPool(LearnerBlockPool):
    """free() decrements but puts the block back in the free list even while others still hold it."""

    def free(self, block, *, keep=False):
        if self.ref_counts[block] <= 0:
            raise ValueError(f"block {block} is already free")
        self.ref_counts[block] -= 1
        self._free[block] = None


class HalfDoneAllocatePool(LearnerBlockPool):
    """Takes blocks one by one and raises OutOfBlocks when it runs out, keeping the ones already taken."""

    def allocate(self, n=1):
        blocks = []
        for _ in range(n):
            if not self._free:
                raise OutOfBlocks(n, len(blocks))
            block, _ = self._free.popitem(last=False)
            if self.on_reuse is not None:
                self.on_reuse(block)
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks


class ForkReturnsNothingPool(LearnerBlockPool):
    """fork() adds the holders but returns None: the forked sequence gets no table."""

    def fork(self, blocks):
        super().fork(blocks)


class AllocateReturnsNothingPool(LearnerBlockPool):
    """allocate() takes the blocks but returns None (a `return` left out): the check says so, it does not break."""

    def allocate(self, n=1):
        super().allocate(n)


# --- wrong managers -----------------------------------------------------------------------------

class NoCopyOnWriteManager(LearnerBlockManager):
    """fork shares the blocks, but appending writes straight into a shared, partly filled last block."""

    def blocks_for_append(self, seq_id, n):
        t = self.table(seq_id)
        return blocks_needed(t.num_tokens + n, self.block_size) - len(t.blocks) if n > 0 else 0

    def append_tokens(self, seq_id, tokens):
        t = self.table(seq_id)
        n = t.num_tokens
        needed = self.blocks_for_append(seq_id, len(tokens))
        if needed > self.pool.num_free:
            raise OutOfBlocks(needed, self.pool.num_free)
        t.blocks.extend(self.pool.allocate(needed))
        t.token_ids.extend(int(x) for x in tokens)
        if self.prefix_cache is not None:
            hashes = self.hashes[seq_id]
            for i in range(len(hashes), t.num_tokens // self.block_size):
                hashes.append(hash_block(hashes[-1] if hashes else None, t.token_ids[i * self.block_size:(i + 1) * self.block_size]))
                self.prefix_cache.register(t.blocks[i], hashes[-1])
        return Reservation(t.slots(n, t.num_tokens))


def off_by_one_slot(table, position, block_size):
    """Uses (p - 1) // block_size: the first position of every block after the first lands in the previous block."""
    index = max(position - 1, 0) // block_size
    if position >= len(table) * block_size:
        raise ValueError("past the table")
    return table[index] * block_size + position % block_size


class OffByOneSlotManager(LearnerBlockManager):
    def append_tokens(self, seq_id, tokens):
        r = super().append_tokens(seq_id, tokens)
        t = self.table(seq_id)
        start = t.num_tokens - len(r.slots)
        r.slots = [off_by_one_slot(t.blocks, p, self.block_size) for p in range(start, t.num_tokens)]
        return r


def unchained_hash(parent, tokens):
    return hash_block(None, tokens)


class UnchainedHashManager(LearnerBlockManager):
    """Hashes each block's tokens alone: equal blocks after different prefixes match."""

    def add_sequence(self, seq_id, prompt, **kw):
        g = LearnerBlockManager.add_sequence.__globals__
        saved = (g["hash_block"], g["block_hashes"])
        g["hash_block"] = unchained_hash
        g["block_hashes"] = lambda toks, bs, salt=None: [hash_block(None, toks[i:i + bs]) for i in range(0, len(toks) - bs + 1, bs)]
        try:
            return super().add_sequence(seq_id, prompt)
        finally:
            g["hash_block"], g["block_hashes"] = saved

    def append_tokens(self, seq_id, tokens):
        g = LearnerBlockManager.append_tokens.__globals__
        saved = g["hash_block"]
        g["hash_block"] = unchained_hash
        try:
            return super().append_tokens(seq_id, tokens)
        finally:
            g["hash_block"] = saved


class ZeroComputeManager(LearnerBlockManager):
    """Reuses a prompt cached to its very end: nothing left to compute, no logits for the first token."""

    def add_sequence(self, seq_id, prompt):
        prompt = [int(t) for t in prompt]
        hits = self.prefix_cache.lookup(lab02_block_hashes(prompt, self.block_size)) if self.prefix_cache else []
        if hits and len(hits) * self.block_size == len(prompt):
            for b in hits:
                self.pool.incref(b)
            from minigpt.cache.block_table import BlockTable
            self.tables[seq_id] = BlockTable(self.block_size, list(hits), prompt)
            self.hashes[seq_id] = lab02_block_hashes(prompt, self.block_size)
            return Reservation([], num_cached=len(prompt))
        return super().add_sequence(seq_id, prompt)


def lab02_block_hashes(tokens, bs):
    from minigpt.cache.prefix_cache import block_hashes
    return block_hashes(tokens, bs)


class HalfDoneManager(LearnerBlockManager):
    """Appends block by block without counting first: out of blocks part-way, the table keeps what it got."""

    def append_tokens(self, seq_id, tokens):
        t = self.table(seq_id)
        if t.num_tokens % self.block_size and self.pool.ref_counts[t.blocks[-1]] > 1:
            return super().append_tokens(seq_id, tokens)
        for _ in range(blocks_needed(t.num_tokens + len(tokens), self.block_size) - len(t.blocks)):
            t.blocks.extend(self.pool.allocate(1))
        return super().append_tokens(seq_id, tokens)


class CopyNotCountedManager(LearnerBlockManager):
    """Counts the new blocks an append needs but not its copy-on-write copy (issue 57: the mutant `- int(cow)`
    survived the drawn steps): one block short, out of blocks after the copy was made."""

    def blocks_for_append(self, seq_id, n):
        t = self.table(seq_id)
        return blocks_needed(t.num_tokens + n, self.block_size) - len(t.blocks) if n > 0 else 0


class CountsFromTheStartManager(LearnerBlockManager):
    """Counts the blocks for n - len(tokens) tokens: too few whenever the append opens a block."""

    def blocks_for_append(self, seq_id, n):
        t = self.table(seq_id)
        cow = t.num_tokens % self.block_size != 0 and self.pool.ref_counts[t.blocks[-1]] > 1
        return max(0, blocks_needed(max(t.num_tokens - n, 0), self.block_size) - len(t.blocks)) + int(cow) if n else 0


class ForkWithoutBlocksManager(LearnerBlockManager):
    """The child's table gets None for its blocks (`BlockTable(bs, None, tokens)`): the check says it could not read
    the state, as a failed check, instead of breaking on it (issue 57: such runs were 'broken', not caught)."""

    def fork(self, parent, child):
        super().fork(parent, child)
        self.tables[child].blocks = None


class StaleHashManager(LearnerBlockManager):
    """Never forgets a hash: a block reused for new content is still found under its old hash."""

    def __init__(self, num_blocks, block_size, *, enable_prefix_caching=False):
        super().__init__(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching)
        self.pool.on_reuse = None


class ForkOverwritesManager(LearnerBlockManager):
    """Forks into any id: a child that already exists loses its table and leaks its blocks (issue 57)."""

    def fork(self, parent, child):
        self.tables.pop(child, None)
        super().fork(parent, child)


class NoReturnManager(LearnerBlockManager):
    """add_sequence does its work but its `return` was left out: the caller gets None, no reservation (issue 57:
    the state machine read a None as OutOfBlocks and went on)."""

    def add_sequence(self, seq_id, prompt):
        super().add_sequence(seq_id, prompt)


WRONG_MANAGERS = {
    "fork into a sequence that exists": factory(ForkOverwritesManager),
    "add_sequence without its return": factory(NoReturnManager),
    "free that does not decrement": factory(with_pool(NoDecrementPool)),
    "free that returns a still-shared block": factory(with_pool(FreeSharedPool)),
    "fork without copy-on-write": factory(NoCopyOnWriteManager),
    "slot mapping off by one at a block boundary": factory(OffByOneSlotManager),
    "unchained block hash": factory(UnchainedHashManager),
    "fully cached prompt computes zero tokens": factory(ZeroComputeManager),
    "stale hash after reuse": factory(StaleHashManager),
    "out of blocks half-way through an allocation": factory(HalfDoneManager),
}

def test_a_manager_whose_state_cannot_be_read_fails_the_check():
    with pytest.raises(AssertionError, match="reading the manager's state failed with TypeError"):
        lab02.check_block_manager(factory(ForkWithoutBlocksManager), max_examples=EXAMPLES)


class ForkForgetsHashesManager(LearnerBlockManager):
    """The child's block hashes are None (`self.hashes[child] = None` survived the drawn steps): its first append
    with prefix caching on breaks."""

    def fork(self, parent, child):
        super().fork(parent, child)
        self.hashes[child] = None


class TableWithoutBlockSizeManager(LearnerBlockManager):
    """A forked table made with block_size None: the manager maps slots with its own size, whoever reads the table
    cannot."""

    def fork(self, parent, child):
        super().fork(parent, child)
        self.tables[child].block_size = None


def test_a_fork_without_its_hashes_or_block_size_fails():
    with pytest.raises(AssertionError, match="state machine|prefix caching on"):
        lab02.check_block_manager(factory(ForkForgetsHashesManager), max_examples=EXAMPLES)
    with pytest.raises(AssertionError, match="BlockTable has block_size None"):
        lab02.check_block_manager(factory(TableWithoutBlockSizeManager), max_examples=EXAMPLES)


# Wrong only where a shared, partial last block meets a nearly full pool: the fixed corner after the drawn steps.
WRONG_AT_THE_COW_CORNER = {
    "the copy-on-write copy not counted": factory(CopyNotCountedManager),
    "blocks counted for n - len(tokens) tokens": factory(CountsFromTheStartManager),
}


# --- the reference passes -----------------------------------------------------------------------

def test_reference_typed_into_the_notebook_passes_every_check():
    lab02.check_block_pool(LearnerBlockPool)
    lab02.check_slot_mapping(learner_slot_of)
    lab02.check_block_hash(learner_hash_block)
    assert lab02.check_block_manager(reference_manager, max_examples=EXAMPLES) >= EXAMPLES
    lab02.check_prefix_cache(reference_manager)
    lab02.check_paged_decode_attention(learner_paged_decode_attention)
    lab02.check_paged_attention(learner_paged_attention)
    lab02.check_paged_generation(learner_paged_attention)


# --- the package's reference is refused: itself, a subclass inheriting the methods, a thin wrapper ----------

class InheritingPool(BlockPool):
    pass


class DelegatingPool(LearnerBlockPool):
    def allocate(self, n=1):
        return BlockPool.allocate(self, n)


class InheritingManager(BlockManager):
    pass


class DelegatingManager(LearnerBlockManager):
    def add_sequence(self, seq_id, prompt, **kw):
        return BlockManager.add_sequence(self, seq_id, prompt, **kw)


REFUSED = [
    (lab02.check_block_pool, BlockPool, "course's reference"),
    (lab02.check_block_pool, InheritingPool, "inherits"),
    (lab02.check_block_pool, DelegatingPool, r"calls the course's reference \(BlockPool.allocate\)"),
    (lab02.check_slot_mapping, slot_of, "course's reference"),
    (lab02.check_slot_mapping, lambda t, p, bs: slot_of(t, p, bs), r"\(slot_of\)"),
    (lab02.check_block_hash, hash_block, "course's reference"),
    (lab02.check_block_hash, lambda parent, tokens: hash_block(parent, tokens), r"\(hash_block\)"),
    (lab02.check_prefix_cache, factory(BlockManager), "course's reference"),
    (lab02.check_prefix_cache, factory(InheritingManager), "inherits"),
    (lab02.check_prefix_cache, factory(DelegatingManager), r"BlockManager.add_sequence"),
    (lab02.check_paged_decode_attention, paged_decode_attention, "course's reference"),
    (lab02.check_paged_decode_attention, lambda *a: paged_decode_attention(*a), r"paged_decode_attention"),
    (lab02.check_paged_attention, paged_attention, "course's reference"),
    (lab02.check_paged_attention, lambda *a: paged_attention(*a), r"\(paged_attention\)"),
    (lab02.check_paged_generation, paged_attention, "course's reference"),
    (lab02.check_paged_generation, lambda *a: paged_attention(*a), r"\(paged_attention\)"),
]


@pytest.mark.parametrize("check, answer, match", REFUSED,
                         ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(REFUSED)])
def test_reference_is_refused(check, answer, match):
    with pytest.raises(ReferenceHandedIn, match=match):
        check(answer)


@pytest.mark.parametrize("make", [factory(BlockManager), factory(InheritingManager), factory(DelegatingManager)],
                         ids=["reference", "subclass", "wrapper"])
def test_state_machine_refuses_the_reference(make):
    with pytest.raises(ReferenceHandedIn):
        lab02.check_block_manager(make, max_examples=3)


# --- stubs fail ---------------------------------------------------------------------------------

@pytest.mark.parametrize("check, arg", [
    (lab02.check_block_pool, StubPool), (lab02.check_slot_mapping, _stub), (lab02.check_block_hash, _stub),
    (lab02.check_prefix_cache, _stub), (lab02.check_paged_decode_attention, _stub),
    (lab02.check_paged_attention, _stub), (lab02.check_paged_generation, _stub),
])
def test_stub_fails(check, arg):
    with pytest.raises(AssertionError, match="not implemented"):
        check(arg)


def test_stub_manager_fails_state_machine():
    with pytest.raises(AssertionError, match="not implemented"):
        lab02.check_block_manager(_stub, max_examples=5)


# --- wrong implementations fail -----------------------------------------------------------------

@pytest.mark.parametrize("name", list(WRONG_MANAGERS))
def test_wrong_manager_fails_state_machine(name):
    with pytest.raises(AssertionError, match="state machine"):
        lab02.check_block_manager(WRONG_MANAGERS[name], max_examples=EXAMPLES)


@pytest.mark.parametrize("name", list(WRONG_AT_THE_COW_CORNER))
def test_wrong_manager_fails_at_the_copy_on_write_corner(name):
    with pytest.raises(AssertionError, match="copy-on-write with the pool nearly full"):
        lab02.check_block_manager(WRONG_AT_THE_COW_CORNER[name], max_examples=EXAMPLES)


@pytest.mark.parametrize("name, pattern", [
    ("fork without copy-on-write", None), ("unchained block hash", "chained"),
    ("fully cached prompt computes zero tokens", "last prompt token"), ("stale hash after reuse", "old hash"),
])
def test_wrong_manager_fails_prefix_or_cow_scenarios(name, pattern):
    if pattern is None:     # copy-on-write is the state machine's job; check the scenario directly
        m = WRONG_MANAGERS[name](8, 4, False)
        m.add_sequence("a", [1, 2, 3, 4, 5, 6])
        m.fork("a", "b")
        r = m.append_tokens("b", [9])
        assert not r.copies and m.table("b").blocks[-1] == m.table("a").blocks[-1]   # the bug: a shared write
        return
    with pytest.raises(AssertionError, match=pattern):
        lab02.check_prefix_cache(WRONG_MANAGERS[name])


@pytest.mark.parametrize("pool_cls, pattern", [
    (NoDecrementPool, "decrement"), (FreeSharedPool, "still held"), (HalfDoneAllocatePool, "changed the pool"),
    (ForkReturnsNothingPool, "must return the forked sequence's table"),
    (AllocateReturnsNothingPool, "must return the list of the block ids it took, got None"),
])
def test_wrong_pool_fails(pool_cls, pattern):
    with pytest.raises(AssertionError, match=pattern):
        lab02.check_block_pool(pool_cls)


def test_off_by_one_slot_fails():
    with pytest.raises(AssertionError, match="first position of a block"):
        lab02.check_slot_mapping(off_by_one_slot)


def test_unchained_hash_fails():
    with pytest.raises(AssertionError, match="chained"):
        lab02.check_block_hash(unchained_hash)


def test_nondeterministic_hash_fails():
    import itertools
    counter = itertools.count()
    with pytest.raises(AssertionError, match="deterministic"):
        lab02.check_block_hash(lambda parent, tokens: next(counter))


# --- wrong attention ----------------------------------------------------------------------------

def decode_ignoring_lengths(q, k_pool, v_pool, block_tables, seq_lens):
    """Attends to every slot of every block in the table, the unused tail of the last block included."""
    B, Hq, D = q.shape
    k, v = learner_gather_kv(k_pool, block_tables), learner_gather_kv(v_pool, block_tables)
    group = Hq // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    w = torch.softmax(torch.einsum("bhd,bhld->bhl", q, k) / math.sqrt(D), -1)
    return torch.einsum("bhl,bhld->bhd", w, v)


def decode_wrong_gqa(q, k_pool, v_pool, block_tables, seq_lens):
    """Maps query head h to KV head h % Hkv instead of h // group."""
    Hkv = k_pool.shape[2]
    Hq = q.shape[1]
    perm = [h % Hkv for h in range(Hq)]
    idx = sorted(range(Hq), key=lambda h: perm[h])
    out = learner_paged_decode_attention(q[:, idx], k_pool, v_pool, block_tables, seq_lens)
    return out[:, torch.argsort(torch.tensor(idx))]


def prefill_top_left(q, k_pool, v_pool, block_tables, seq_lens, q_lens=None):
    """Mask aligned top-left: query i sees keys j <= i, wrong for a chunk after a cached prefix and for decode."""
    return _top_left(q, k_pool, v_pool, block_tables, seq_lens, q_lens)


def _top_left(q, k_pool, v_pool, block_tables, seq_lens, q_lens):
    B, Hq, Tq, D = q.shape
    k, v = learner_gather_kv(k_pool, block_tables), learner_gather_kv(v_pool, block_tables)
    group = Hq // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-2, -1) / math.sqrt(D)
    L = k.shape[2]
    mask = (torch.arange(L)[None, None, :] <= torch.arange(Tq)[None, :, None]) & (torch.arange(L)[None, None, :] < seq_lens.long()[:, None, None])
    return torch.softmax(s.masked_fill(~mask[:, None], float("-inf")), -1) @ v


def shifted_table(q, k_pool, v_pool, block_tables, seq_lens, q_lens=None):
    """Reads logical block i from block_tables[b, i + 1] when it exists (an off-by-one in the table lookup)."""
    shifted = torch.cat([block_tables[:, 1:], block_tables[:, -1:]], 1)
    return learner_paged_attention(q, k_pool, v_pool, shifted, seq_lens, q_lens)


@pytest.mark.parametrize("fn", [decode_ignoring_lengths, decode_wrong_gqa])
def test_wrong_decode_attention_fails(fn):
    with pytest.raises(AssertionError, match="differs"):
        lab02.check_paged_decode_attention(fn)


@pytest.mark.parametrize("fn", [prefill_top_left, shifted_table])
def test_wrong_paged_attention_fails(fn):
    with pytest.raises(AssertionError, match="differs"):
        lab02.check_paged_attention(fn)


@pytest.mark.parametrize("fn", [prefill_top_left, shifted_table])
def test_wrong_paged_attention_fails_generation(fn):
    with pytest.raises(AssertionError):
        lab02.check_paged_generation(fn)


# --- interview questions ------------------------------------------------------------------------

def test_interview_answers():
    lab02.check_q1_block_waste(14)
    lab02.check_q2_paged_capacity(465)
    lab02.check_q3_prefix_compute_saved(113_488)
    lab02.check_q4_ttft_with_cache(1600 / 112)
    for check, wrong, note in [(lab02.check_q1_block_waste, 2, "fill of the last block"),
                               (lab02.check_q2_paged_capacity, 468, "whole blocks"),
                               (lab02.check_q2_paged_capacity, 80, "preallocation"),
                               (lab02.check_q3_prefix_compute_saved, 101_500, "FULL blocks"),
                               (lab02.check_q4_ttft_with_cache, 16.0, "whole blocks")]:
        with pytest.raises(AssertionError, match=note):
            check(wrong)


def _replay_q5(prompt_len: int, a_generated: int = 5, samples: int = 4, new_tokens: int = 20) -> int:
    """Q5's scenario on the package's BlockManager: blocks with a reference count >= 1 at the end."""
    from minigpt.cache.block_manager import BlockManager
    manager = BlockManager(64, 16, enable_prefix_caching=True)
    prompt = list(range(1000, 1000 + prompt_len))
    manager.add_sequence("A", prompt)
    for _ in range(a_generated):
        manager.append_tokens("A", [1])
    manager.add_sequence("B0", prompt)
    for j in range(1, samples):
        manager.fork("B0", f"B{j}")
    for _ in range(new_tokens):
        for j in range(samples):
            manager.append_tokens(f"B{j}", [2 + j])
    return sum(1 for count in manager.pool.ref_counts if count > 0)


def test_q5_key_matches_the_package_manager():
    """The check's count from the manager's rules equals a replay on minigpt's BlockManager, on Q5's prompt (48
    tokens: full last block, no copy) and on a 40-token one (partly filled last block: copies)."""
    from autograder.lab02.questions import Q5, q5_blocks_in_use
    assert q5_blocks_in_use() == _replay_q5(48) == 13
    saved = dict(Q5)
    try:
        Q5["prompt"] = 40
        assert q5_blocks_in_use() == _replay_q5(40)
    finally:
        Q5.update(saved)
    lab02.check_q5_blocks_in_use(13)


@pytest.mark.parametrize("wrong, note", [(12, "last prompt token must be computed"), (15, "finds them and shares"),
                                         (16, "partly filled"), (24, "shares every block")])
def test_q5_each_mistake_is_diagnosed(wrong, note):
    with pytest.raises(AssertionError, match=note):
        lab02.check_q5_blocks_in_use(wrong)


def test_q5_mistakes_are_distinct_from_the_key():
    from autograder.lab02.questions import q5_blocks_in_use
    wrongs = [q5_blocks_in_use(last_token_rule=False), q5_blocks_in_use(prefix_hits=False),
              q5_blocks_in_use(copy_full_shared=True), q5_blocks_in_use(fork_shares=False)]
    assert q5_blocks_in_use() not in wrongs and len(set(wrongs)) == len(wrongs)
    with pytest.raises(AssertionError, match="is right but"):
        lab02.check_q5_blocks_in_use(13.0)


# --- exercise 4 is graded alone: the package's pool and hash stand in for exercises 1 and 3 ---------------------

def _solution_manager(pool_code: str, hash_code: str) -> type:
    from tests.labs.notebook_solutions import solution_cells
    preamble = ("from minigpt.cache.block_pool import OutOfBlocks\nfrom minigpt.cache.block_table import slot_of\n"
                + pool_code + "\n" + hash_code)
    return solution_cells("02_paged_kv_cache", "ex4_code", preamble=preamble)["BlockManager"]


def test_exercise_4_passes_over_failed_exercises_1_and_3_and_gets_them_back():
    manager = _solution_manager("class BlockPool:\n    def __init__(self, *a, **k):\n        raise NotImplementedError()",
                                "def hash_block(parent, tokens):\n    raise NotImplementedError()")
    mine = (manager.__dict__["pool_class"], manager.__dict__["hash_fn"])
    assert lab02.check_block_manager(manager, max_examples=5) >= 5
    lab02.check_prefix_cache(manager)
    assert (manager.__dict__["pool_class"], manager.__dict__["hash_fn"]) == mine
    with pytest.raises(NotImplementedError):
        manager(4, 2)


def test_exercise_4_accepts_the_package_pool_and_hash_as_the_way_to_continue():
    manager = _solution_manager("from minigpt.cache.block_pool import BlockPool",
                                "from minigpt.cache.prefix_cache import hash_block")
    lab02.check_prefix_cache(manager)


def test_exercise_4_still_refuses_the_package_manager_handed_in_as_a_class():
    with pytest.raises(ReferenceHandedIn, match="course's reference"):
        lab02.check_prefix_cache(BlockManager)
    assert "pool_class" not in vars(BlockManager) and "hash_fn" not in vars(BlockManager)


# --- gaps the random state machine never reached: targeted scenarios -----------------------------------------

class HeadFirstEvictionManager(LearnerBlockManager):
    """free() returns a sequence's blocks head first, so its head block (the shared prefix) is evicted first."""

    def free(self, seq_id):
        t = self.table(seq_id)
        for block in t.blocks:
            self.pool.free(block, keep=self._cached(block))
        del self.tables[seq_id]
        del self.hashes[seq_id]
        self.roots.pop(seq_id, None)


class IgnoresRevivedAdmissionManager(LearnerBlockManager):
    """Admission counts only the new blocks against the free queue, forgetting that the cached blocks it reuses
    leave that queue too: right everywhere except near a full pool with cached free blocks."""

    def add_sequence(self, seq_id, prompt, **kw):
        g = LearnerBlockManager.add_sequence.__globals__
        prompt = [int(t) for t in prompt]
        hashes = g["block_hashes"](prompt, self.block_size) if self.prefix_cache is not None else []
        hits = (self.prefix_cache.lookup(hashes) if self.prefix_cache is not None else [])
        hits = hits[:(len(prompt) - 1) // self.block_size]
        needed = blocks_needed(len(prompt), self.block_size) - len(hits)
        if needed > self.pool.num_free:                                     # the bug: revived blocks not counted
            raise OutOfBlocks(needed, self.pool.num_free)
        for b in hits:
            self.pool.incref(b)
        num_cached = len(hits) * self.block_size
        self.tables[seq_id] = g["BlockTable"](self.block_size, list(hits), prompt[:num_cached])
        self.hashes[seq_id] = hashes[:len(hits)]
        self.roots[seq_id] = None
        reservation = self.append_tokens(seq_id, prompt[num_cached:])
        reservation.num_cached = num_cached
        return reservation


@pytest.mark.parametrize("cls, match", [(HeadFirstEvictionManager, "TAIL block"),
                                        (IgnoresRevivedAdmissionManager, "count them|BEFORE taking any|count against")],
                         ids=["head-first-eviction", "admission-ignores-revived"])
def test_targeted_prefix_scenarios_catch(cls, match):
    """Both bugs pass the graded state machine (60 random examples, measured), so each has its own scenario."""
    with pytest.raises(AssertionError, match=match):
        lab02.check_prefix_cache(factory(cls))


class LeakyAfterBadReadManager(LearnerBlockManager):
    """Reports wrong slots for appended tokens (an invariant fails) AND frees nothing (the teardown would fail)."""

    def append_tokens(self, seq_id, tokens):
        r = super().append_tokens(seq_id, tokens)
        r.slots = [s + 1 for s in r.slots]
        return r

    def free(self, seq_id):
        del self.tables[seq_id]


def test_state_machine_reports_the_invariant_not_the_teardown():
    with pytest.raises(AssertionError) as info:
        lab02.check_block_manager(factory(LeakyAfterBadReadManager), max_examples=10)
    assert "blocks leaked" not in str(info.value)
    assert "reads position" in str(info.value) or "neither free nor referenced" in str(info.value) or \
        "ref_counts" in str(info.value), str(info.value)


# --- the same verdict in every process ---------------------------------------------------------------------

class SharedTailWriteManager(LearnerBlockManager):
    """Borderline: copy-on-write is skipped when the shared last block has exactly one free slot left."""

    def blocks_for_append(self, seq_id, n):
        t = self.table(seq_id)
        if t.num_tokens % self.block_size == self.block_size - 1:
            return blocks_needed(t.num_tokens + n, self.block_size) - len(t.blocks)
        return super().blocks_for_append(seq_id, n)

    def append_tokens(self, seq_id, tokens):
        t = self.table(seq_id)
        if tokens and t.num_tokens % self.block_size == self.block_size - 1:
            n = t.num_tokens
            needed = self.blocks_for_append(seq_id, len(tokens))
            if needed > self.pool.num_free:
                raise OutOfBlocks(needed, self.pool.num_free)
            t.blocks.extend(self.pool.allocate(needed))
            t.token_ids.extend(int(x) for x in tokens)
            g = LearnerBlockManager.append_tokens.__globals__
            if self.prefix_cache is not None:
                hashes = self.hashes[seq_id]
                for i in range(len(hashes), t.num_tokens // self.block_size):
                    hashes.append(g["hash_block"](hashes[-1] if hashes else None,
                                                  t.token_ids[i * self.block_size:(i + 1) * self.block_size]))
                    self.prefix_cache.register(t.blocks[i], hashes[-1])
            return Reservation(t.slots(n, t.num_tokens))
        return super().append_tokens(seq_id, tokens)


def state_machine_verdict(examples: int = lab02.GRADED_EXAMPLES) -> str:
    """The graded state machine's verdict on a borderline wrong manager: 'passed' or its message."""
    try:
        lab02.check_block_manager(factory(SharedTailWriteManager), max_examples=examples)
    except AssertionError as err:
        return str(err)
    return "passed"


def test_state_machine_verdict_is_the_same_in_a_script_python_c_a_kernel_and_the_judge(tmp_path):
    """hypothesis mixes constants from loaded modules' source into its examples; the graded check draws from a
    fixed example source instead, so a script, `python -c`, a Jupyter kernel (which load different modules) and the
    judge (autograder/judging/judge.py: a check cell in the course kernel runs there, the manager a Remote in the kernel)
    reach the same verdict. Costs about 15 s (three fresh processes) and the judged run."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import nbformat
    from nbclient import NotebookClient

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "shared"), str(root)])}
    code = "from tests.labs.test_lab02_checks import state_machine_verdict\nprint(state_machine_verdict())\n"
    script = tmp_path / "verdict.py"
    script.write_text("import sys\nsys.path[:0] = %r\n" % [str(root / "shared"), str(root)] + code)
    by_script = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                               timeout=300).stdout.strip()
    by_c = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                          timeout=300).stdout.strip()
    judged = ("from autograder.lab02 import check_block_manager\n"      # a check cell: the kernel hands it to the judge
              "from autograder.checking.wire import is_remote\nprint('judged' if is_remote(make_manager) else 'in the kernel')\n"
              "try:\n    check_block_manager(make_manager)\nexcept AssertionError as err:\n    print(err)\n"
              "else:\n    print('passed')\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import sys\nsys.path[:0] = %r\nimport matplotlib.pyplot, IPython.display\n" % [str(root / "shared"), str(root)]
        + code), nbformat.v4.new_code_cell(
        "from tests.labs.test_lab02_checks import SharedTailWriteManager, factory\n"
        "make_manager = factory(SharedTailWriteManager)"), nbformat.v4.new_code_cell(judged)])
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    by_kernel, by_judge = ("".join(o.get("text", "") for o in nb.cells[i].outputs if o.get("name") == "stdout").strip()
                           for i in (0, 2))
    where, _, by_judge = by_judge.partition("\n")
    assert where == ("in the kernel" if os.environ.get("COURSE_JUDGE") == "0" else "judged"), where
    assert by_script, "the script printed nothing"
    assert by_script.startswith("block manager state machine: "), by_script[:300]   # caught, in the graded count
    assert by_script == by_c == by_kernel == by_judge, (by_script[:300], by_c[:300], by_kernel[:300], by_judge[:300])
