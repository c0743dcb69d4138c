"""The model: shapes, dtypes, determinism, RoPE, GQA, attention implementations, extension points."""

import dataclasses

import pytest
import torch
from torch import nn

from minigpt.attention import causal_mask, naive_attention, sdpa_attention
from minigpt.config import DRAFT_CONFIG, TARGET_CONFIG, ModelConfig
from minigpt.model import GPT, apply_rope, rope_angles

from minigpt_fixtures import TINY


def test_logits_shape_and_dtype(tiny_model):
    tokens = torch.randint(0, TINY.vocab_size, (3, 10))
    assert tiny_model(tokens).shape == (3, 10, TINY.vocab_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_runs_in_each_dtype(tiny_model, dtype):
    tokens = torch.randint(0, TINY.vocab_size, (2, 8))
    ref = tiny_model(tokens)
    out = tiny_model.to(dtype)(tokens)
    assert out.dtype == dtype
    assert torch.allclose(out.float(), ref, atol=0.05), "low-precision logits drifted far from float32"


def test_seed_determinism():
    torch.manual_seed(7)
    a = GPT(TINY)
    torch.manual_seed(7)
    b = GPT(TINY)
    tokens = torch.randint(0, TINY.vocab_size, (1, 12))
    assert torch.equal(a(tokens), b(tokens))


def test_causality_future_tokens_do_not_change_past_logits(tiny_model):
    tokens = torch.randint(0, TINY.vocab_size, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % TINY.vocab_size
    assert torch.allclose(tiny_model(tokens)[:, :8], tiny_model(changed)[:, :8], atol=1e-6)


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(pq: int, pk: int) -> float:
        rq = apply_rope(q, rope_angles(torch.tensor([pq]), 16, 10_000.0))
        rk = apply_rope(k, rope_angles(torch.tensor([pk]), 16, 10_000.0))
        return float((rq * rk).sum())

    assert score(5, 2) == pytest.approx(score(105, 102), rel=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 4), rel=1e-3)


def test_rope_preserves_norm_and_is_identity_at_zero():
    x = torch.randn(2, 3, 4, 8)
    rotated = apply_rope(x, rope_angles(torch.arange(3) * 17, 8, 10_000.0))
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert torch.allclose(apply_rope(x, rope_angles(torch.zeros(3), 8, 10_000.0)), x)


def test_gqa_with_all_kv_heads_equals_mha():
    """n_kv_heads == n_heads is plain multi-head attention: same weights, same logits as a hand-written MHA."""
    cfg = dataclasses.replace(TINY, n_kv_heads=TINY.n_heads)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 9))

    def mha(q, k, v):   # no grouping at all: every query head has its own K and V
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(), float("-inf"))
        return scores.softmax(-1) @ v

    out = model(tokens)
    model.set_attention(mha)
    assert torch.allclose(out, model(tokens), atol=1e-5)


def test_gqa_equals_mha_with_repeated_kv_weights():
    """GQA is MHA whose K/V projections repeat each KV head for its group of query heads."""
    torch.manual_seed(0)
    gqa = GPT(TINY).eval()
    mha = GPT(dataclasses.replace(TINY, n_kv_heads=TINY.n_heads)).eval()
    state = gqa.state_dict()
    hd, group = TINY.head_dim, TINY.group_size
    for key in list(state):
        if key.endswith(("attn.wk.weight", "attn.wv.weight")):
            state[key] = state[key].view(TINY.n_kv_heads, hd, -1).repeat_interleave(group, dim=0).reshape(-1, TINY.d_model)
    mha.load_state_dict(state)
    tokens = torch.randint(0, TINY.vocab_size, (2, 11))
    assert torch.allclose(gqa(tokens), mha(tokens), atol=1e-5)


@pytest.mark.parametrize("q_len,k_len", [(7, 7), (1, 9), (3, 9)])
def test_sdpa_matches_naive_with_offset(q_len, k_len):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, q_len, 8), torch.randn(2, 2, k_len, 8), torch.randn(2, 2, k_len, 8)
    assert torch.allclose(sdpa_attention(q, k, v), naive_attention(q, k, v), atol=1e-5)


def test_causal_mask_is_bottom_right_aligned():
    assert causal_mask(1, 4).tolist() == [[True, True, True, True]]
    assert causal_mask(2, 3).tolist() == [[True, True, False], [True, True, True]]


def test_linear_factory_sees_every_projection_by_name():
    names = []

    def factory(i, o, name):
        names.append(name)
        return nn.Linear(i, o, bias=False)

    GPT(TINY, make_linear=factory)
    assert len(names) == 7 * TINY.n_layers
    assert "layers.1.mlp.w_down" in names and "layers.0.attn.wq" in names


def test_course_model_sizes():
    assert GPT(TARGET_CONFIG).num_parameters() == 11_015_040
    assert GPT(DRAFT_CONFIG).num_parameters() == 918_144


@pytest.mark.parametrize("bad,match", [
    (dict(d_model=30, n_heads=4), "divisible"),
    (dict(n_heads=4, n_kv_heads=3), "multiple"),
    (dict(n_layers=0), "positive"),
])
def test_bad_config(bad, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TINY, **bad)


def test_bad_inputs_have_clear_errors(tiny_model):
    V, C = TINY.vocab_size, TINY.max_seq_len
    with pytest.raises(TypeError, match="integer"):
        tiny_model(torch.rand(1, 4))
    with pytest.raises(ValueError, match=r"\(batch, seq\)"):
        tiny_model(torch.randint(0, V, (4,)))
    with pytest.raises(ValueError, match="longer than the context"):
        tiny_model(torch.randint(0, V, (1, C + 1)))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny_model(torch.tensor([[1, V]]))
    with pytest.raises(ValueError, match="outside the context"):
        tiny_model(torch.tensor([[1, 2]]), positions=torch.tensor([C - 1, C]))
    with pytest.raises(ValueError, match="pass `positions`"):
        tiny_model(torch.tensor([[1]]), kv_caches=[None] * TINY.n_layers)
    with pytest.raises(TypeError, match="torch.Tensor"):
        tiny_model([[1, 2]])


def test_wrong_device_is_named(tiny_model):
    tokens = torch.randint(0, TINY.vocab_size, (1, 4), device="meta")
    with pytest.raises(ValueError, match="model is on cpu"):
        tiny_model(tokens)


def test_unknown_attention_name():
    with pytest.raises(ValueError, match="unknown attention"):
        GPT(TINY, attention="flash9")


def test_config_round_trip():
    assert ModelConfig.from_dict(TARGET_CONFIG.to_dict()) == TARGET_CONFIG
    with pytest.raises(ValueError, match="unknown ModelConfig"):
        ModelConfig.from_dict({**TARGET_CONFIG.to_dict(), "n_expert": 8})
