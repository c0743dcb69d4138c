"""Lab 06's token-tree view without a browser: its rounds are generate_with_head's greedy rounds (same tokens, same
trees' sizes and accepted paths), the nodes are classed and laid out as drawn, and the view steps, resets and
starts over on a new shape."""

from __future__ import annotations

import pytest

from autograder.lab06.head_chain import tiny_target_and_head
from minigpt.engine.head_speculative import TreeRound, TreeShape, generate_with_head, head_rounds
from minigpt.teaching.tree_view import TreeView, node_status, round_html, tree_layout

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    return tiny_target_and_head(3)


@pytest.fixture(scope="module")
def course():
    from minigpt.checkpoint import load_model
    from minigpt.engine.draft_head import load_draft_head
    from minigpt.tokenizer import load_tokenizer
    return load_model("target"), load_draft_head(), load_tokenizer()


def _joined(rounds: list[TreeRound]) -> list[int]:
    return [t for r in rounds for t in r.new_tokens]


@pytest.mark.parametrize("shape", [TreeShape(0), TreeShape(3), TreeShape(3, 2, 2), TreeShape(2, 3, 3)])
@pytest.mark.parametrize("prompt_len", [1, 6])
def test_rounds_join_to_generate_with_heads_greedy_tokens(tiny, shape, prompt_len):
    target, head = tiny
    prompt = list(range(5, 5 + prompt_len))
    want = generate_with_head(target, head, prompt, 14, shape=shape, stop_token_ids=())
    rounds = list(head_rounds(target, head, prompt, 14, shape=shape, stop_token_ids=()))
    assert _joined(rounds) == want.tokens, f"expected generate_with_head's {want.tokens}, got {_joined(rounds)}"
    assert [(len(r.tokens), len(r.path), r.emitted) for r in rounds] == \
        [(w.nodes, w.accepted, w.emitted) for w in want.rounds]
    assert [r.finish_reason for r in rounds] == [None] * (len(rounds) - 1) + ["length"]


def test_the_course_models_rounds_are_generate_with_heads(course):
    target, head, enc = course
    prompt, shape = enc.encode("def main():\n    "), TreeShape(3, 2, 2)
    want = generate_with_head(target, head, prompt, 12, shape=shape, stop_token_ids=())
    rounds = list(head_rounds(target, head, prompt, 12, shape=shape, stop_token_ids=()))
    assert _joined(rounds) == want.tokens, f"expected {enc.decode(want.tokens)!r}, got {enc.decode(_joined(rounds))!r}"
    assert [len(r.path) for r in rounds] == [w.accepted for w in want.rounds]


def test_a_stop_token_ends_the_round_it_is_emitted_in(tiny):
    target, head = tiny
    free = _joined(list(head_rounds(target, head, [1, 2, 3], 16, shape=TreeShape(2, 2, 2), stop_token_ids=())))
    stop = free[5]
    want = generate_with_head(target, head, [1, 2, 3], 16, shape=TreeShape(2, 2, 2), stop_token_ids=(stop,))
    rounds = list(head_rounds(target, head, [1, 2, 3], 16, shape=TreeShape(2, 2, 2), stop_token_ids=(stop,)))
    assert _joined(rounds) == want.tokens == free[:free.index(stop)]
    assert rounds[-1].finish_reason == "stop_token"


def test_nodes_are_classed_by_the_greedy_walk():
    #   0 ─┬─ 1 ── 3          path [2, 4]: 2 and 4 accepted; 1 and 5 compared and turned down; 3 never reached
    #      └─ 2 ─┬─ 4
    #            └─ 5
    parents = [-1, 0, 0, 1, 2, 2]
    assert node_status(parents, [2, 4]) == ["root", "rejected", "accepted", "not checked", "accepted", "rejected"]
    assert node_status(parents, []) == ["root", "rejected", "rejected", "not checked", "not checked", "not checked"]


def test_the_layout_puts_depth_across_and_parents_between_their_children():
    xy = tree_layout([-1, 0, 0, 1, 2, 2])
    assert [x for x, _ in xy] == [0, 1, 1, 2, 2, 2]
    assert [y for _, y in xy] == [0.75, 0.0, 1.5, 0.0, 1.0, 2.0]


def test_the_readout_states_the_rounds_numbers():
    r1 = TreeRound([7, 8, 9], [-1, 0, 0], [1], [8, 4], [8, 4], None)
    r2 = TreeRound([4], [-1], [], [6], [6], "length")
    text = round_html([r1, r2], TreeShape(1, 1, 2), lambda ids: "".join(f"<{i}>" for i in ids), "a<b")
    assert "round 2</b>" in text and "1 node</b>" in text and "0 accepted" in text and "1 token emitted" in text
    assert "after 2 rounds: 3 tokens" in text and "1.50 tokens per round" in text and "finished: length" in text
    assert "a&lt;b" in text and "&lt;6&gt;" in text


def test_the_view_steps_resets_and_starts_over_on_a_new_shape(course):
    target, head, enc = course
    view = TreeView("def main():\n    ", depth=3, width=2, branch=2, max_new_tokens=10, target=target, head=head,
                    tokenizer=enc)
    assert "round 1</b>" in view.readout.value and view.image.value[:4] == b"\x89PNG"
    first = view.image.value
    view.next_button.click()
    assert "round 2</b>" in view.readout.value and "after 2 rounds" in view.readout.value
    assert view.image.value != first
    view.reset_button.click()
    assert "round 1</b>" in view.readout.value and len(view.rounds) == 1
    view.next_button.click()
    view.branch.value = 1                        # a new shape starts over
    assert view.shape == TreeShape(3, 2, 1) and len(view.rounds) == 1 and "branch 1" in view.readout.value
    while not view.next_button.disabled:
        view.next_button.click()
    want = generate_with_head(target, head, enc.encode("def main():\n    "), 10, shape=TreeShape(3, 2, 1))
    assert view.tokens == want.tokens and "finished: length" in view.readout.value
