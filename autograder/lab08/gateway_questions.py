"""Lab 08, interview questions: the gateway."""

from __future__ import annotations

import math
import secrets
from typing import Any

from autograder.harness import call_learner, check_answer


# ---------------------------------------------------------------------------------------------------
# Interview questions: the gateway
# ---------------------------------------------------------------------------------------------------

Q1_REQUEST_RATE, Q1_UTILIZATION = 100_000, 0.8     # req/s the gateway serves; the share of its goodput a replica runs at
Q1_SHOWN = (3.2, 4.5)        # (goodput, request throughput) per replica, req/s: a case where every mistake below differs


def _q1_replicas(rate: float, per_replica: float, utilization: float) -> int:
    return math.ceil(rate / (per_replica * utilization))


def _q1_figures(draws: int) -> list[tuple[float, float]]:
    """Q1_SHOWN, then `draws` sustained figures of one replica as section 5 could measure them: goodput between 0.5
    and 4 req/s, request throughput 1.2-2x that (past its goodput a replica still answers, late). Drawn with
    `secrets`: a table of answers for figures known in advance answers none of them."""
    rng = secrets.SystemRandom()
    drawn = []
    for _ in range(draws):
        goodput = round(rng.uniform(0.5, 4.0), 2)
        drawn.append((goodput, round(goodput * rng.uniform(1.2, 2.0), 2)))
    return [Q1_SHOWN, *drawn]


def check_q_gateway_replicas(answer: Any, *, draws: int = 3) -> None:
    """`answer(per_replica_goodput, per_replica_throughput)`: the replicas a gateway needs for Q1_REQUEST_RATE req/s
    when one replica delivers `per_replica_goodput` req/s within the latency objectives (and `per_replica_throughput`
    req/s in all) and runs at most at Q1_UTILIZATION of its goodput: ceil(rate / (goodput * utilization)).

    Asked on Q1_SHOWN and on `draws` figures drawn here, not on the notebook's own measurement: the answer is a rule
    for any replica's figures, and grading need not measure a replica again (section 5's 36 s of sustained runs)."""
    if not callable(answer):
        raise AssertionError("Q1 (gateway replicas): answer_q1 is a function of (per_replica_goodput, "
                             f"per_replica_throughput) that returns the number of replicas; got {answer!r:.80}")
    rate, utilization = Q1_REQUEST_RATE, Q1_UTILIZATION
    for goodput, throughput in _q1_figures(draws):
        got = call_learner("Q1 (gateway replicas): answer_q1", answer, goodput, throughput,
                           context=f"for a replica of {goodput:g} req/s goodput, {throughput:g} req/s throughput")
        expected = _q1_replicas(rate, goodput, utilization)
        mistakes = [(math.floor(rate / (goodput * utilization)),
                     "rounded down: a fractional replica means one more replica, round UP"),
                    (_q1_replicas(rate, goodput, 1.0), "no headroom: run each replica at most at "
                     f"{utilization:.0%} of its goodput, so queues stay short when traffic bursts"),
                    (_q1_replicas(rate, throughput, utilization), "sized on raw request throughput: past its goodput "
                     "a replica still answers, but late; size on goodput (requests meeting the SLO)"),
                    (math.ceil(rate * utilization / goodput), "multiplied by the utilization instead of dividing: "
                     "each replica may carry only utilization x its goodput")]
        check_answer(got, expected, f"Q1: replicas for {rate:,} req/s with answer_q1({goodput:g}, {throughput:g}) "
                     f"(goodput and throughput per replica, run at {utilization:.0%})",
                     [(v, m) for v, m in mistakes if v != expected], unit="replicas")


AFFINITY_SCENARIOS = {
    "A": "an agent framework: every request starts with the same 2,000-token tool description and few-shot preamble",
    "B": "a batch job summarising a million unrelated documents, each prompt different from the first token",
    "C": "multi-turn chat, each conversation starting differently, its first prompt already longer than the blocks "
         "the router hashes: each turn resends the whole conversation so far (the history is the previous turn's "
         "prompt)",
    "D": "a platform serving 200 customers from 16 replicas, each customer with its own 2,000-token system prompt and "
         "a similar share of the traffic; one replica's KV pool holds about 20 such prefixes besides its running "
         "requests",
    "E": "short prompts (under one KV block) with long answers",
}
AFFINITY_ANSWER = frozenset({"C", "D"})


def check_q_affinity_pays(answer: Any) -> None:
    """The set of AFFINITY_SCENARIOS letters where prefix-aware routing (pure consistent hashing on the first blocks)
    clearly pays: it raises the prefix-cache hit rate without a balance problem."""
    if isinstance(answer, str):
        answer = set(answer.replace(",", " ").split())
    if not isinstance(answer, (set, frozenset, list, tuple)) or not all(isinstance(x, str) for x in answer):
        raise AssertionError(f"answer with a set of letters from {sorted(AFFINITY_SCENARIOS)}, e.g. {{'A'}}; got {answer!r}")
    got = {x.strip().upper() for x in answer}
    unknown = got - set(AFFINITY_SCENARIOS)
    if unknown:
        raise AssertionError(f"unknown scenario(s) {sorted(unknown)}; choose from {sorted(AFFINITY_SCENARIOS)}")
    why = {"A": "A: one prefix shared by EVERY request hashes to one key, so consistent hashing sends all the traffic to "
                "one replica (the others idle), while round-robin misses that prefix only once per replica and then "
                "hits it everywhere: affinity buys almost nothing and costs the balance",
           "B": "B has no shared prefix: nothing to reuse, so affinity only costs balance",
           "C": "C is the classic case: a conversation's next turn extends its last prompt, so the replica that served "
                "the last turn still holds its KV blocks (route on the first blocks: the whole conversation stays "
                "together), and many conversations spread over the ring. The premise matters: a conversation whose "
                "first prompt is shorter than the hashed blocks changes key every turn until it outgrows them",
           "D": "D: 200 prefixes do not fit in one replica's cache (about 20): round-robin sends every prefix to every "
                "replica, so they evict one another, while hashing gives each prefix one home (about 200 / 16 = 12.5 "
                "per replica, which fit) and spreads the 200 keys evenly",
           "E": "E: a prompt shorter than one block has no full block to cache; there is nothing to route on"}
    wrong = sorted(got ^ AFFINITY_ANSWER)
    if not wrong:
        return
    if len(wrong) == 1:
        raise AssertionError("not quite: " + why[wrong[0]])
    if "A" in got:             # the hot-prefix trap: diagnosed even when another scenario is misjudged too
        raise AssertionError(f"not quite: {why['A']}; and {len(wrong) - 1} more scenario(s) misjudged")
    raise AssertionError(f"{len(wrong)} scenarios are misjudged; for each, ask how often round-robin would miss the "
                         "prefix, and how evenly hashing on it spreads the load")
