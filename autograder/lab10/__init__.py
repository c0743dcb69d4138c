"""Checks for Lab 10, structured generation: one module per exercise group, every check re-exported here.

    check_mask_by_scan(mask_by_scan)        every token's text walked from a regex automaton's state    (masks.py)
    check_mask_by_trie(mask_by_trie)        the same masks from a token-trie walk, characters counted by the judge
    check_object_rules(object_rules)        a JSON object's rules, run by the judge's recognizer        (grammar_rules.py)
    check_generate_json(generate_json)      greedy constrained decoding on the judge's models            (decoding.py)
    check_jump_forward(jump_forward_json)   forced tokens without their own forward pass, passes observed
Interview questions: check_q1_index_bytes, check_q2_tokenizations, check_q3_hidden_batch (questions.py).
Every check refuses the package's reference handed in (reference_guard); shared pieces live in common.py.
"""

from autograder.lab10.decoding import check_generate_json, check_jump_forward
from autograder.lab10.grammar_rules import check_object_rules
from autograder.lab10.masks import check_mask_by_scan, check_mask_by_trie
from autograder.lab10.questions import check_q1_index_bytes, check_q2_tokenizations, check_q3_hidden_batch

__all__ = ["check_mask_by_scan", "check_mask_by_trie", "check_object_rules", "check_generate_json",
           "check_jump_forward", "check_q1_index_bytes", "check_q2_tokenizations", "check_q3_hidden_batch"]
