"""Checks for Lab 13, the KV cache hierarchy: one module per exercise group, every check re-exported here.

Every check first refuses the package's reference handed in as the answer (the object itself, a subclass that
inherits the asked-for methods, a thin wrapper that calls it: autograder.checking.reference_guard).

CPU tier (correctness):
    radix.check_radix_match_insert(cls)     Exercise 1: the learner's RadixCache (match, insert, split) on the judge's
                                            block pool beside the package's tree on a pool of its own: references,
                                            cached prefixes (no duplicate, no partial block), answers; fixed
                                            scenarios (full-prefix hit, the same prefix computed twice in one step,
                                            a split) then a hypothesis state machine (seeded)
    radix.check_radix_evict(cls)            Exercise 2: evict (LRU unreferenced leaves, on_evict told each block's
                                            prefix) the same way, on a pool that runs short
    admission.check_admission_order(fn)     Exercise 3: longest cached prefix first with a starvation bound, on the
                                            judge's queues (hand-made, each mistake named, and drawn)
    offload.check_crossover_tokens(fn)      Exercise 4: the shortest prefix at which loading beats recomputing,
                                            exactly the package's on real shapes, links and accelerators
    restore.check_restore_prefix(fn)        Exercise 5: a cached prefix loaded back from the judge's host tier
                                            through its HostLoader (copies land only when waited for): the run
                                            loaded, the cost model asked, every copy started before the other work
                                            and waited for before the prefill, each block holding its key's KV
Interview questions (questions.py): check_q1_load_speedup (Llama-3-70B over PCIe 4.0), check_q2_mha_from_nvme
(Llama-2-7B from an NVMe SSD), check_q3_radix_nodes (a tree's nodes after three inserts); each mistake diagnosed.
"""

from autograder.lab13.admission import check_admission_order
from autograder.lab13.offload import check_crossover_tokens
from autograder.lab13.questions import check_q1_load_speedup, check_q2_mha_from_nvme, check_q3_radix_nodes
from autograder.lab13.radix import check_radix_evict, check_radix_match_insert
from autograder.lab13.restore import check_restore_prefix

__all__ = ["check_radix_match_insert", "check_radix_evict", "check_admission_order", "check_crossover_tokens", "check_restore_prefix",
           "check_q1_load_speedup", "check_q2_mha_from_nvme", "check_q3_radix_nodes"]
