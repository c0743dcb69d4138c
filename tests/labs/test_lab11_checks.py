"""Lab 11 checks: the solution notebook's answers pass, also through the judge's wire (the logged runner, the
channels, the block store, the router and the experts stay in the judge); the stub, the package's reference handed
in and each plausible wrong implementation fail with a message that names the exercise and the mistake."""

from __future__ import annotations

import pytest
import torch

from autograder import lab11
from autograder.checking.reference_guard import ReferenceHandedIn
from autograder.lab11 import common
from minigpt.disagg import layerwise, receiver, transfer_cost
from minigpt.disagg.channel import KVMessage, TransferError
from minigpt.disagg.layerwise import LayerRunner
from minigpt.disagg.timeline import LoggedRunner, RecordingChannel, ScriptedChannel, Timeline
from minigpt.moe import ep_exchange, eplb, expert_parallel
from tests.instructor.hostile_three import lab11_pen
from tests.labs.judged import learner_process
from tests.labs.judged_pair import judged
from tests.labs.notebook_solutions import solution_cells

PREAMBLE = "import math\nimport torch\nfrom minigpt.disagg.channel import TransferError\n"
CELLS = {"ex1_code": (("layer_send_ends",), lab11.check_layer_send_ends),
         "ex2_code": (("prefill_and_send",), lab11.check_prefill_and_send),
         "ex3_code": (("receive_kv",), lab11.check_receive_kv),
         "ex4_code": (("moe_forward",), lab11.check_moe_forward),
         "ex5_code": (("ep_dispatch", "ep_combine"), lab11.check_ep_exchange),
         "ex6_code": (("eplb_placement",), lab11.check_eplb_placement)}


def solution(cell: str, replace: dict[str, str] | None = None) -> tuple:
    names, _ = CELLS[cell]
    ns = solution_cells("11_disaggregation_moe", cell, preamble=PREAMBLE, replace=replace)
    return tuple(ns[n] for n in names)


def run(cell: str, replace: dict[str, str] | None = None) -> None:
    CELLS[cell][1](*solution(cell, replace))


@pytest.mark.parametrize("cell", CELLS)
def test_the_solution_passes(cell: str) -> None:
    run(cell)


def test_the_solution_passes_through_the_judge() -> None:
    """As the judge runs them: the learner's functions are Remotes; the runner, channels, store, router and experts
    are the judge's, served to the kernel only through the methods the exercises name."""
    (send,), (recv,), (moe,) = solution("ex2_code"), solution("ex3_code"), solution("ex4_code")
    dispatch, combine = solution("ex5_code")
    with judged(send=send, recv=recv, moe=moe, dispatch=dispatch, combine=combine) as learner:
        lab11.check_prefill_and_send(learner.send)
        lab11.check_receive_kv(learner.recv)
        lab11.check_moe_forward(learner.moe)
        lab11.check_ep_exchange(learner.dispatch, learner.combine)


def stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize("cell", CELLS)
def test_the_stub_fails(cell: str) -> None:
    with pytest.raises(AssertionError, match="not implemented"):
        CELLS[cell][1](*[stub] * len(CELLS[cell][0]))


@pytest.mark.parametrize("cell, references", [
    ("ex1_code", (transfer_cost.layer_send_ends,)), ("ex2_code", (layerwise.prefill_and_send,)),
    ("ex3_code", (receiver.receive_kv,)), ("ex4_code", (expert_parallel.moe_forward,)),
    ("ex5_code", (ep_exchange.ep_dispatch, ep_exchange.ep_combine)), ("ex6_code", (eplb.eplb_placement,))])
def test_the_reference_is_refused(cell: str, references: tuple) -> None:
    with pytest.raises(ReferenceHandedIn):
        CELLS[cell][1](*references)


@pytest.mark.parametrize("cell, source", [
    ("ex2_code", "from minigpt.disagg import layerwise as _ref\n"
                 "def prefill_and_send(runner, prompt, channel, request_id):\n"
                 "    return _ref.prefill_and_send(runner, prompt, channel, request_id)\n"),
    ("ex3_code", "from minigpt.disagg import receiver as _ref\n"
                 "def receive_kv(channel, request_id, n_layers, n_tokens, store):\n"
                 "    return _ref.receive_kv(channel, request_id, n_layers, n_tokens, store)\n"),
    ("ex4_code", "from minigpt.moe import layer as _ref\n"
                 "def moe_forward(x, probabilities, experts, top_k):\n"
                 "    w, ids = torch.topk(probabilities(x), top_k, dim=-1)\n"
                 "    plan = _ref.dispatch(x, ids, len(experts), None)\n"
                 "    return _ref.combine(_ref.run_experts(experts, plan), plan, w / w.sum(-1, keepdim=True), len(x))\n"),
])
def test_a_wrapper_around_the_reference_is_refused(cell: str, source: str) -> None:
    namespace: dict = {}
    exec("import torch\n" + source, namespace)
    with pytest.raises(AssertionError, match="calls the course's reference"):
        CELLS[cell][1](namespace[CELLS[cell][0][0]])


WRONG = [
    # Exercise 1
    ("ex1_code", {"link_free = max(computed, link_free) + x": "link_free = computed + x"}, "one send at a time"),
    ("ex1_code", {"computed += t": "computed = t"}, "sum of compute_s"),
    ("ex1_code", {"    ends, computed, link_free = [], 0.0, 0.0\n":
                  "    ends, computed, link_free = [], 0.0, 0.0\n    start = sum(compute_s)\n",
                  "link_free = max(computed, link_free) + x": "link_free = max(start, link_free) + x"}, "WHOLE prefill"),
    # Exercise 2
    ("ex2_code", {"        x, k, v = runner.layer(i, x)\n        channel.send(request_id, i, k, v)\n":
                  "        x, k, v = runner.layer(i, x)\n        kvs = locals().setdefault('kvs', []); kvs.append((k, v))\n"
                  "    for i, (k, v) in enumerate(kvs):\n        channel.send(request_id, i, k, v)\n"},
     "whole-request variant"),
    ("ex2_code", {"        x, k, v = runner.layer(i, x)\n        channel.send(request_id, i, k, v)\n":
                  "        x, k, v = runner.layer(i, x)\n        kvs = locals().setdefault('kvs', []); kvs.append((k, v))\n"
                  "    for i, (k, v) in reversed(list(enumerate(kvs))):\n        channel.send(request_id, i, k, v)\n"},
     "out of order"),
    ("ex2_code", {"channel.send(request_id, i, k, v)": "channel.send(request_id, i, v, k)"}, "swapped"),
    ("ex2_code", {"channel.send(request_id, i, k, v)": "channel.send('request', i, k, v)"}, "request id"),
    ("ex2_code", {"channel.send(request_id, i, k, v)": "None if i == runner.n_layers - 1 else "
                                                     "channel.send(request_id, i, k, v)"}, "one message per layer"),
    ("ex2_code", {"return int(runner.logits(x).argmax())": "return int(runner.logits(x).argmin())"}, "greedy first token"),
    ("ex2_code", {"        channel.send(request_id, i, k, v)\n":     # the pen: a send the channel refuses, swallowed
                  "        try:\n            channel.send(request_id, i, None, None)\n        except Exception:\n"
                  "            pass\n"}, "the judge received 0"),
    # Exercise 3
    ("ex3_code", {"    return blocks\n": "    return list(message.src_blocks)\n"}, "PRODUCER's block ids"),
    ("ex3_code", {"while len(arrived) < n_layers:": "while len(arrived) < n_layers - 1:"}, "wait until the last layer"),
    ("ex3_code", {"        store.free(blocks)\n        raise": "        raise"}, "stay allocated"),
    # a receive that would wait for ever on a lost message (found by the differential test of issue 57)
    ("ex3_code", {"channel.recv(timeout_s=10.0)": "channel.recv(timeout_s=None)"}, "timeout_s=None"),
    ("ex3_code", {"        store.free(blocks)\n        raise": "        store.free(blocks)\n        return blocks"},
     "returned a table although the transfer failed"),
    ("ex3_code", {"store.write(message.layer, blocks, message.k, message.v)":
                  "store.write(len(arrived), blocks, message.k, message.v)"}, "arrival index"),
    ("ex3_code", {"            store.write(message.layer, blocks, message.k, message.v)\n":
                  "            mine = store.allocate(len(blocks))\n"
                  "            store.write(message.layer, mine, message.k, message.v)\n"}, "OutOfBlocks|newly allocated|allocate them once"),
    ("ex3_code", {"if message.request_id != request_id or message.layer in arrived": "if message.layer in arrived"},
     "another request's messages"),
    ("ex3_code", {"message.layer in arrived or not": "not"}, "layer 0 twice"),
    ("ex3_code", {"not 0 <= message.layer < n_layers": "not 0 <= message.layer <= n_layers"}, "does not have"),
    ("ex3_code", {"        store.free(blocks)\n        raise":    # the table's positions freed, not its block ids
                  "        store.free(list(range(len(blocks))))\n        raise"}, "other requests hold were freed"),
    ("ex3_code", {"            store.write(message.layer, blocks, message.k, message.v)\n":
                  "            store.write(message.layer, blocks, message.k, message.v)\n"
                  "            store.write(message.layer, message.src_blocks, message.k, message.v)\n"}, "written over"),
    # Exercise 4
    ("ex4_code", {"    weights = weights / weights.sum(dim=-1, keepdim=True)\n": ""}, "renormalise"),
    ("ex4_code", {"        token, slot = (ids == e).nonzero(as_tuple=True)\n        if token.numel():\n"
                  "            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])\n":
                  "        gate = (weights * (ids == e)).sum(-1, keepdim=True)\n        out += gate * expert(x)\n"},
     "dense reference"),
    ("ex4_code", {"            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])\n":
                  "            for t, s in zip(token.tolist(), slot.tolist()):\n"
                  "                out[t] += expert(x[t:t + 1])[0] * weights[t, s]\n"}, "called .* times"),
    ("ex4_code", {"    out = torch.zeros_like(x)\n": "    out = torch.zeros_like(x)\n    done = 0\n",
                  "            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])\n":
                  "            rows = expert(x[token]) * weights[token, slot, None]\n"
                  "            out[done:done + len(token)] += rows[: len(out) - done]\n"
                  "            done = min(done + len(token), len(out))\n"}, "own row"),
    # Exercise 5
    ("ex5_code", {"            out[token] += weights[token, slot] * row\n":
                  "            out[min(len(out) - 1, pairs.index((token, slot)))] += weights[token, slot] * row\n"}, "ORIGINAL order"),
    ("ex5_code", {"    taken = [0] * len(placement)\n": "    taken = [0] * n_ranks\n",
                  "            if capacity is not None and taken[e] >= capacity:\n":
                  "            if capacity is not None and taken[placement[e]] >= capacity:\n",
                  "            taken[e] += 1\n": "            taken[placement[e]] += 1\n"}, "per destination RANK"),
    ("ex5_code", {"            if capacity is not None and taken[e] >= capacity:\n":
                  "            if False:\n"}, "per EXPERT"),
    ("ex5_code", {"plan[placement[e]].append((token, slot))":
                  "plan[e * n_ranks // len(placement)].append((token, slot))"}, "lives on rank"),
    ("ex5_code", {"    for token in range(n_tokens):\n        for slot in range(k):\n":
                  "    for slot in range(k):\n        for token in range(n_tokens):\n"}, "token order|token 0"),
    ("ex5_code", {"out = torch.zeros(n_tokens, returned[0].shape[1])": "out = torch.zeros(n_tokens, returned[1].shape[1])"},
     "raised IndexError.*1 ranks"),
    # Exercise 6
    ("ex6_code", {"    for _ in range(n_ranks * slots_per_rank - len(load)):\n":
                  "    for _ in range(0):\n"}, "rank 0 hosts|slots"),
    ("ex6_code", {"hot = max(range(len(load)), key=lambda e: load[e] / replicas[e])":
                  "hot = max(range(len(load)), key=lambda e: load[e])"}, "slowest rank carries"),
    ("ex6_code", {"        fresh = [r for r in open_ranks if e not in placement[r]] or open_ranks\n":
                  "        fresh = open_ranks\n"}, "slowest rank carries"),
    ("ex6_code", {"        r = min(fresh, key=lambda r: rank_load[r])\n": "        r = fresh[0]\n"},
     "slowest rank carries"),
    ("ex6_code", {"hot = max(range(len(load)), key=lambda e: load[e] / replicas[e])":       # the last expert never
                  "hot = max(range(len(load) - 1), key=lambda e: load[e] / replicas[e])"},  # replicated (issue 57)
     "hottest expert listed last.*slowest rank carries"),
]


@pytest.mark.parametrize("cell, edit, match", WRONG, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(WRONG)])
def test_a_plausible_wrong_version_is_rejected(cell: str, edit: dict[str, str], match: str) -> None:
    with pytest.raises(AssertionError, match=match) as caught:
        run(cell, edit)
    assert caught.value.args[0].startswith("Exercise "), caught.value


# Q1 by hand: 80 layers of 8 ms compute; each layer's K and V (32 MiB) take 20 us + 33,554,432 / 3.125e9 s on the
# link, longer than a layer's compute, so the sends queue: the last ends at 8 ms + 80 sends.
Q1_SEND = 20e-6 + 2 * 8 * 128 * 8192 * 2 / 3.125e9
Q1_RIGHT = (0.008 + 80 * Q1_SEND - 0.64) * 1e3


@pytest.mark.parametrize("check, right, wrong, match", [
    (lab11.check_q1_transfer_ms, Q1_RIGHT, Q1_SEND * 1e3, "queue"),
    (lab11.check_q1_transfer_ms, Q1_RIGHT, 80 * Q1_SEND * 1e3, "overlap the prefill"),
    (lab11.check_q1_transfer_ms, Q1_RIGHT, (80 * Q1_SEND - 0.64) * 1e3, "first send cannot start"),
    (lab11.check_q1_transfer_ms, Q1_RIGHT, (20e-6 + 8 * 128 * 8192 * 2 / 3.125e9) * 1e3, "K AND V"),
    (lab11.check_q2_placement_rate, 10.5, 8 * 5.2 * 2.1 / 7.3, "GPUs come whole"),
    (lab11.check_q3_ep_bytes, 4 * 7168 * 3, 3 * 7168 * 3, "own node"),
    (lab11.check_q3_ep_bytes, 4 * 7168 * 3, 7 * 7168 * 3, "inside 4 nodes"),
    (lab11.check_q3_ep_bytes, 4 * 7168 * 3, 8 * 7168 * 3, "one copy per NODE"),
    (lab11.check_q3_ep_bytes, 4 * 7168 * 3, 7 * (1 - (7 / 8) ** 8) * 7168 * 3, "the most"),
])
def test_interview_questions(check, right, wrong, match) -> None:
    check(right)
    with pytest.raises(AssertionError, match=match):
        check(wrong)


@pytest.mark.parametrize("check, near_miss", [
    (lab11.check_q1_transfer_ms, Q1_RIGHT * 1.001),                                      # 0.1% off
    (lab11.check_q3_ep_bytes, 4 * 7168 * 3 * 1.001),
])
def test_an_interview_answer_a_tenth_of_a_percent_off_fails(check, near_miss) -> None:
    with pytest.raises(AssertionError, match="is not right"):
        check(near_miss)


# ---------------------------------------------------------------------------------------------------
# The judge's objects only report (issue 55): the pen, judged in a second process as in a graded notebook, and the
# calls the judge's ends refuse without leaving a record
# ---------------------------------------------------------------------------------------------------

def _defined(source: str, name: str):
    namespace: dict = {}
    exec(PREAMBLE + source, namespace)
    return namespace[name]


class _NotATensor:
    """What a notebook could hand the judge instead of a tensor: under the judge a handle, whose every use would run
    the notebook's code inside the judge's call."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def detach(self) -> torch.Tensor:
        return self.t


pen_producer = _defined(lab11_pen.ATTACK, "prefill_and_send")
honest_producer = _defined(lab11_pen.SOLUTION, "prefill_and_send")


def stand_in_producer(runner, prompt, channel, request_id):
    """Sends objects of its own for k and v: the judge's channel would call back into them while noting the send."""
    x = runner.embed(prompt)
    for i in range(runner.n_layers):
        x, k, v = runner.layer(i, x)
        channel.send(request_id, i, _NotATensor(k), _NotATensor(v))
    return int(runner.logits(x).argmax())


def test_the_pen_earns_nothing_judged_in_another_process() -> None:
    """tests/instructor/hostile_three/lab11_pen.py at the check level: the producer's code in a second process, the
    runner and the channel the judge's. Before the fix its failed sends wrote "send i" and it passed (so did the
    stand-in's, whose detach() the judge's channel ran in the notebook's process)."""
    served = ["pen_producer", "honest_producer", "stand_in_producer"]
    with learner_process("tests.labs.test_lab11_checks", served) as learner:
        lab11.check_prefill_and_send(learner["honest_producer"])
        with pytest.raises(AssertionError, match=r"send one message per layer \(3\); the judge received 0"):
            lab11.check_prefill_and_send(learner["pen_producer"])
        with pytest.raises(AssertionError, match="Exercise 2 .*raised TypeError: k must be a torch.Tensor"):
            lab11.check_prefill_and_send(learner["stand_in_producer"])


def test_the_check_wants_every_layers_message_whatever_the_log_says(monkeypatch) -> None:
    """Even a channel that notes a send before refusing it (the RecordingChannel before the fix) does not let the pen
    through: the check also wants one message per layer, read from the messages the judge holds."""
    def noted_then_refused(self, request_id, layer, k, v):
        self.log.add("send", layer)
        self.messages.append(KVMessage(request_id, layer, k.detach().clone(), v.detach().clone(), []))

    monkeypatch.setattr(RecordingChannel, "send", noted_then_refused)
    with pytest.raises(AssertionError, match="no message arrived for layer 0"):
        lab11.check_prefill_and_send(pen_producer)


def _ends() -> tuple[Timeline, LoggedRunner, RecordingChannel, ScriptedChannel]:
    m = common.model("MHA 2q/2kv, 2 layers")
    log = Timeline()
    message = KVMessage("r", 0, torch.zeros(2, 2, 8), torch.zeros(2, 2, 8), [])
    return log, LoggedRunner(LayerRunner(m), log), RecordingChannel(log), ScriptedChannel([message], log=log)


X = torch.zeros(2, 16)
KV = torch.zeros(2, 2, 8)


@pytest.mark.parametrize("call", [
    lambda runner, channel, inbox: channel.send("r", 0, None, None),
    lambda runner, channel, inbox: channel.send("r", 0, _NotATensor(KV), _NotATensor(KV)),
    lambda runner, channel, inbox: channel.send("r", True, KV, KV),
    lambda runner, channel, inbox: channel.send("r", 0, X, X),
    lambda runner, channel, inbox: channel.send(0, 0, KV, KV),
    lambda runner, channel, inbox: runner.embed(_NotATensor(torch.tensor([1, 2]))),
    lambda runner, channel, inbox: runner.layer(0, _NotATensor(X)),
    lambda runner, channel, inbox: runner.layer(0.0, X),
    lambda runner, channel, inbox: runner.logits(_NotATensor(X)),
    lambda runner, channel, inbox: inbox.recv(_NotATensor(KV)),
], ids=["send None", "send a stand-in", "send layer True", "send 2-D", "send request 0", "embed a stand-in",
        "layer on a stand-in", "layer 0.0", "logits of a stand-in", "recv a stand-in timeout"])
def test_a_call_the_judges_ends_refuse_leaves_no_record(call) -> None:
    log, runner, channel, inbox = _ends()
    with pytest.raises((TypeError, ValueError)):
        call(runner, channel, inbox)
    assert (log.kinds(), channel.messages, inbox.delivered) == ([], [], 0)


def test_the_judges_ends_note_each_call_after_it_ran() -> None:
    log, runner, channel, inbox = _ends()
    x, k, v = runner.layer(0, runner.embed([1, 2]))
    channel.send("r", 0, k, v)
    inbox.recv(1.0)
    with pytest.raises(TransferError):
        inbox.recv(1.0)
    assert log.kinds() == ["embed", "layer 0", "send 0", "recv 0", "recv"]
    assert [(m.layer, torch.equal(m.k, k)) for m in channel.messages] == [(0, True)] and inbox.delivered == 1


@pytest.mark.parametrize("change", [
    lambda s, mine: s.write(0, _NotATensor(mine), KV, KV),
    lambda s, mine: s.write(0, mine, _NotATensor(KV), KV),
    lambda s, mine: s.write(0, [float(b) for b in mine], KV, KV),
    lambda s, mine: s.free(_NotATensor(mine)),
    lambda s, mine: s.allocate(1.0),
], ids=["write a stand-in table", "write a stand-in k", "write float ids", "free a stand-in", "allocate 1.0"])
def test_the_decode_store_takes_plain_data_only(change) -> None:
    s = common.store(common.model("MHA 2q/2kv, 2 layers"), 4, 4)
    mine = s.allocate(1)
    before = (s.pool.free_blocks(), list(s.pool.ref_counts), s.cache.k_pools[0].clone())
    with pytest.raises(TypeError):
        change(s, mine)
    assert (s.pool.free_blocks(), list(s.pool.ref_counts)) == before[:2] and torch.equal(s.cache.k_pools[0], before[2])
