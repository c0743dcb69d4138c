"""Lab 01, Exercises 4 and 5 (the decode step without its overhead): the reference re-typed as notebook code
passes, the stub, the package's reference and each plausible wrong implementation fail with a message that names
the exercise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autograder.lab01 import check_decode_step, check_fuse_weights
from autograder.checking.reference_guard import ReferenceHandedIn
from minigpt.engine import static_decode
from minigpt.engine.static_decode import k_major
from minigpt.model import rope_angles
from tests.labs.learner_copy import as_learner

learner_fuse = as_learner(static_decode.fuse_weights, k_major=as_learner(k_major))
learner_step = as_learner(static_decode.decode_step)


def _stub(*args, **kwargs):
    raise NotImplementedError()


def test_the_reference_retyped_passes():
    check_fuse_weights(learner_fuse)
    check_decode_step(learner_step)


@pytest.mark.parametrize("check, fn", [(check_fuse_weights, static_decode.fuse_weights),
                                       (check_decode_step, static_decode.decode_step)])
def test_the_package_reference_is_refused(check, fn):
    with pytest.raises(ReferenceHandedIn):
        check(fn)


def test_a_wrapper_around_the_reference_is_refused():
    def decode_step(*args):
        return static_decode.decode_step(*args)
    with pytest.raises(ReferenceHandedIn):
        check_decode_step(as_learner(decode_step, static_decode=static_decode))


@pytest.mark.parametrize("check", [check_fuse_weights, check_decode_step])
def test_the_stub_fails(check):
    with pytest.raises(AssertionError, match="not implemented yet"):
        check(_stub)


# --- wrong fusions: each a one-line change of the reference ---------------------------------------------------

def _fuse_changed(**changes):
    """The reference's dict with some entries replaced by changes[key](state, config)."""
    def fuse_weights(state, config):
        w = learner_fuse(state, config)
        w.update({key: fn(state, config) for key, fn in changes.items()})
        return w
    return as_learner(fuse_weights, learner_fuse=learner_fuse, changes=changes)


def _layers(fn):
    return lambda state, cfg: [fn(state, f"layers.{i}.") for i in range(cfg.n_layers)]


WRONG_FUSIONS = {
    "nn.Linear's (out, in) layout": (
        _fuse_changed(qkv=_layers(lambda s, p: torch.cat([s[p + "attn.wq.weight"], s[p + "attn.wk.weight"],
                                                          s[p + "attn.wv.weight"]]))), "K-major"),
    "k, q, v order": (
        _fuse_changed(qkv=_layers(lambda s, p: torch.cat([s[p + "attn.wk.weight"], s[p + "attn.wq.weight"],
                                                          s[p + "attn.wv.weight"]]).t().contiguous())), "columns hold"),
    "up before gate": (
        _fuse_changed(gate_up=_layers(lambda s, p: torch.cat([s[p + "mlp.w_up.weight"],
                                                              s[p + "mlp.w_gate.weight"]]).t().contiguous())), "gate, then up"),
    "the embedding as the head of an untied model": (
        _fuse_changed(head=lambda s, c: s["tok_emb.weight"].t().contiguous()), "own lm_head"),
    "qkv transposed without .contiguous() (a view in the old memory order)": (
        _fuse_changed(qkv=_layers(lambda s, p: torch.cat([s[p + "attn.wq.weight"], s[p + "attn.wk.weight"],
                                                          s[p + "attn.wv.weight"]]).t())), "strides"),
    "RoPE table without the model's base and scaling": (
        _fuse_changed(cos=lambda s, c: rope_angles(torch.arange(c.max_seq_len), c.head_dim, 10000.0).cos()), "rope_theta"),
    "the table of the first max_seq_len / 2 positions": (
        _fuse_changed(sin=lambda s, c: rope_angles(torch.arange(c.max_seq_len // 2), c.head_dim, c.rope_theta,
                                                   c.rope_scaling).sin()), "sin"),
}


@pytest.mark.parametrize("name", WRONG_FUSIONS)
def test_a_wrong_fusion_fails(name):
    fn, message = WRONG_FUSIONS[name]
    with pytest.raises(AssertionError, match="Exercise 4") as err:
        check_fuse_weights(fn)
    assert message in str(err.value)


# --- wrong steps ---------------------------------------------------------------------------------------------

def _rope(x, cos, sin):
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def _step(*, rope_k=True, write_at=0, whole_buffer=False, final_norm=True, gqa="interleave", own_angles=False,
          rotate_stored_k=True, norm_eps=True):
    """decode_step with one thing changed (the defaults are the reference's choices)."""
    @torch.inference_mode()
    def decode_step(w, config, token, position, k_cache, v_cache):
        H, Hkv, D, d, eps = config.n_heads, config.n_kv_heads, config.head_dim, config.d_model, config.norm_eps
        eps = eps if norm_eps else None                 # None: torch's default, the dtype's machine epsilon
        if own_angles:
            angles = rope_angles(torch.tensor([position]), D, 10000.0)[0]
            cos, sin = angles.cos(), angles.sin()
        else:
            cos, sin = w["cos"][position], w["sin"][position]
        x = w["embed"][token][None]
        for i in range(config.n_layers):
            q, k, v = (F.rms_norm(x, (d,), w["attn_norm"][i], eps) @ w["qkv"][i]).split([H * D, Hkv * D, Hkv * D], -1)
            q, k_raw = _rope(q.view(H, D), cos, sin), k.view(Hkv, D)
            k = _rope(k_raw, cos, sin) if rope_k else k_raw
            k_cache[i, position + write_at] = k if rotate_stored_k else k_raw
            v_cache[i, position + write_at] = v.view(Hkv, D)
            end = config.max_seq_len if whole_buffer else position + 1
            keys, values = k_cache[i, :end].transpose(0, 1), v_cache[i, :end].transpose(0, 1)
            if gqa == "repeat":
                keys, values = keys.repeat(H // Hkv, 1, 1), values.repeat(H // Hkv, 1, 1)
            else:
                keys, values = keys.repeat_interleave(H // Hkv, 0), values.repeat_interleave(H // Hkv, 0)
            out = F.scaled_dot_product_attention(q[:, None], keys, values)
            x = x + out.reshape(1, H * D) @ w["wo"][i]
            gate, up = (F.rms_norm(x, (d,), w["mlp_norm"][i], eps) @ w["gate_up"][i]).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ w["down"][i]
        if final_norm:
            x = F.rms_norm(x, (d,), w["norm"], eps)
        return (x @ w["head"])[0]
    return as_learner(decode_step, _rope=_rope, rope_k=rope_k, write_at=write_at, whole_buffer=whole_buffer,
                      final_norm=final_norm, gqa=gqa, own_angles=own_angles, rotate_stored_k=rotate_stored_k,
                      norm_eps=norm_eps)


def test_the_step_written_with_explicit_gqa_passes():
    check_decode_step(_step())


WRONG_STEPS = {
    "keys not rotated": (_step(rope_k=False), "after RoPE"),
    "keys stored before RoPE": (_step(rotate_stored_k=False), "after RoPE"),
    "written one slot late": (_step(write_at=1), "changed k_cache"),
    "the whole buffer read, unmasked": (_step(whole_buffer=True), "slots [0, position] only"),
    "no final norm": (_step(final_norm=False), "logits differ"),
    "KV heads tiled, not interleaved": (_step(gqa="repeat"), "groups of query heads"),
    "RoPE recomputed with the default base": (_step(own_angles=True), "after RoPE"),
    "RMSNorm without the model's epsilon": (_step(norm_eps=False), "Exercise 5"),
}


@pytest.mark.parametrize("name", WRONG_STEPS)
def test_a_wrong_step_fails(name):
    fn, message = WRONG_STEPS[name]
    with pytest.raises(AssertionError, match="Exercise 5") as err:
        check_decode_step(fn)
    assert message in str(err.value)
