"""Checks for Lab 06, speculative decoding.

Each check takes the learner's function, runs it on seeded inputs and raises AssertionError saying what is wrong.
Every check first refuses the package's reference handed in as the answer (the function itself, a partial of it,
code from the package, a thin wrapper that calls it while the check runs: autograder.checking.reference_guard).

The sampler is graded statistically: chi-square goodness-of-fit tests at a fixed significance (SIGNIFICANCE) of the
first emitted token, the first two, and the second and third (the third is the first round's bonus token when both
drafts are accepted) against the target's exact distribution, on bigram toy models with a 6-token vocabulary. The
sample sizes (VERIFY_SAMPLES, ENGINE_SAMPLES) are sized for the smallest bias they must see: each wrong sampler kept
in tests/labs/test_lab06_checks.py is rejected with at least 99% power (`samples_for_power`, asserted there). A
smaller bias needs far more: a TV distance of 0.009 moved between the target's two likeliest tokens after the toy
prompt needs about 113,000 samples for 99% power (about 2,300 when moved into its rarest token), so the tests are
sized per mistake, not per TV distance.

CPU tier, one module per exercise group:
    rollback.check_truncate_cache(fn)        cache rollback: lengths, kept data, clear errors, nothing changed on error
    probabilities.check_sampling_probs(fn)   temperature / top-k / top-p / greedy distributions, exact
    verify.check_verify_draft(fn)            accept min(1, p/q), the clipped and normalised residual (an unclipped one
                                             is named, not left to torch's 'probability tensor contains ... < 0'),
                                             the bonus token from p[k], same generator seed -> same tokens;
                                             distribution test
    generator.check_generate_speculative(fn) greedy == target greedy (trained models); cache contents after
                                             rejections; the bonus token; stop tokens; same seed -> same tokens;
                                             distribution test end to end (T = 3, top-k 3: a target distribution
                                             that ignores top-k shows)
    lookup.check_ngram_propose(fn)           prompt-lookup proposals
    lookup.check_acceptance_stats(rate_fn, tokens_fn)   sum min(p, q) and (1 - a^(k+1)) / (1 - a)
    speed.check_target_calls(fn)             deterministic proxy: target forward calls per token, prompt lookup and
                                             the draft model, below plain decoding's 1, at most the reference's + 1
                                             and at least what the tokens need, on the judge's own target (secretly
                                             perturbed: judge_target.py), whose greedy tokens must come out
    speed.check_speculative_speedup(fn)      wall clock with prompt lookup (PromptLookupModel): above 1x plain cached
                                             decoding and the calibrated fraction of the reference's speedup
Exercise 4 and the speed grades run the learner's generator with the package's truncate_cache, sampling_probs and
verify_draft (common.with_reference_pieces), so they grade its loop alone.
Part two (draft heads and token trees):
    head_chain.check_draft_chain(fn)         greedy chain drafting with a draft head: drafts and the head's cache (keys
                                             written, length) against the reference on a small random target and head
    trees.check_tree_attention_inputs(fn)    tree attention mask and positions on fixed and drawn trees; bad parents refused
    trees.check_verify_tree(fn)              greedy walks (the argmax in any sibling, stops, accepted leaves) exact;
                                             sampled verification by a chi-square test on the bigram toy (trees of depth
                                             2, two children a node drawn from the draft)
    trees.check_keep_path(fn)                the accepted nodes' keys and values moved down, lengths, refusal unchanged
    Each check makes its expected answers before the learner's code runs (the reference guard refuses any call into
    the reference inside the checked block).
Interview questions (questions.py, keys computed from first principles, not with the calculator the notebook
imports): check_q1_acceptance, check_q2_best_k (pick k when acceptance decays with the draft position, each wrong pick
diagnosed), check_q3_speedup_from_logs (alpha recovered from a logged mean acceptance length, then priced at another
k), check_q4_break_even_batch (an additive step-time model and a draft that costs a share of a step).
Shared (common.py): the sample sizes, the toy models, the chi-square power arithmetic, the seeds a check draws.
Judged (the learner's functions are `Remote`s in the judge): a model whose forwards a check counts or traces is the
judge's (a handle: each forward is a request to the judge, seen whether it calls the model or its `forward`:
common.watch_forward); a model whose calls only feed outputs compared in the judge is built where the learner's code
runs (common.where_it_runs), so a sample or a timed generation is one request.
What the judge draws stays the judge's (common.drawn_seeds: `secrets`): the tiny pair whose forwards exercise 4 counts
comes from a seed the kernel is never sent (the pair built in the kernel has a seed of its own); the counted target is
the trained one secretly perturbed; every timed or counted call gets a prompt of its own (prompts.py). Greedy outputs
are compared only where no step is a near tie (near_ties.py), so the verdict does not depend on the draw.
"""

from autograder.lab06.common import (ENGINE_SAMPLES, SIGNIFICANCE, SPEED_CHECK, TOY_SAMPLING, VERIFY_SAMPLES, BigramLM,
                                     _toy_tables, noncentrality_for_power, rejection_threshold, samples_for_power,
                                     toy_pair, with_reference_pieces)
from autograder.lab06.generator import _tiny_pair, check_generate_speculative, engine_distribution_test
from autograder.lab06.lookup import check_acceptance_stats, check_ngram_propose
from autograder.lab06.probabilities import check_sampling_probs
from autograder.lab06.head_chain import check_draft_chain
from autograder.lab06.questions import (check_q1_acceptance, check_q2_best_k, check_q3_speedup_from_logs,
                                        check_q4_break_even_batch, check_q5_chain_or_tree, check_q6_head_share)
from autograder.lab06.rollback import check_truncate_cache
from autograder.lab06.prompts import code_edit_prompts
from autograder.lab06.speed import check_speculative_speedup, check_target_calls
from autograder.lab06.trees import check_keep_path, check_tree_attention_inputs, check_verify_tree, tree_distribution_test
from autograder.lab06.verify import check_verify_draft, verify_distribution_test

__all__ = ["check_truncate_cache", "check_sampling_probs", "check_verify_draft", "check_generate_speculative",
           "check_ngram_propose", "check_acceptance_stats", "check_speculative_speedup", "check_target_calls",
           "check_q1_acceptance", "check_q2_best_k", "check_q3_speedup_from_logs", "check_q4_break_even_batch",
           "check_draft_chain", "check_tree_attention_inputs", "check_verify_tree", "check_keep_path",
           "check_q5_chain_or_tree", "check_q6_head_share", "tree_distribution_test",
           "SIGNIFICANCE", "VERIFY_SAMPLES", "ENGINE_SAMPLES", "SPEED_CHECK", "TOY_SAMPLING", "BigramLM", "toy_pair",
           "verify_distribution_test", "engine_distribution_test", "code_edit_prompts", "rejection_threshold",
           "noncentrality_for_power", "samples_for_power", "_toy_tables", "_tiny_pair", "with_reference_pieces"]
