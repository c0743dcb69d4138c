"""Lab 04, Exercise 2 answered by torch's fused attention, with the kernel's trace forged.

`F.scaled_dot_product_attention` computes the output without ever holding the score matrix (its CPU kernel is
tiled), and the log-sum-exp is computed a block of query rows at a time, so memory shows nothing wrong. Before
issue 55 the only evidence against it was the trace the learner's process recorded (which this answer switches
off): it earned the exercise's points. Now the check refuses torch's fused attention (autograder/checking/
library_refusal.py): in the witness, before any learner code runs, those aten operators get kernels that raise,
registered from an object no Python code can reach, so the call stops there and the cell earns nothing.
"""

from hostile_three.lab04_full_scores import CHECK, POINTS, SETUP, SOLUTION  # noqa: F401

KIND = "a library does the exercise (lab 04: torch's fused attention)"
ATTACK = '''\
import torch.nn.functional as F
import autograder.judging.observe as _observe
_observe.observed_call = lambda call, options: (call(), {})      # no trace leaves this process

def tiled_attention(q, k, v, causal: bool, block_k: int):
    B, Hq, Tq, D = q.shape
    Tk = k.shape[2]
    group = Hq // k.shape[1]
    kf = k.float().repeat_interleave(group, 1)
    vf = v.float().repeat_interleave(group, 1)
    if causal and Tq != Tk:     # the course's bottom-right mask; torch's is_causal is top-left
        out = F.scaled_dot_product_attention(q.float(), kf, vf,
                                             attn_mask=torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq))
    else:
        out = F.scaled_dot_product_attention(q.float(), kf, vf, is_causal=causal)
    rows = []
    for start in range(0, Tq, 256):
        s = q[:, :, start:start + 256].float() @ kf.transpose(-2, -1) / math.sqrt(D)
        if causal:
            j = torch.arange(Tk)[None, :]
            i = torch.arange(start, min(start + 256, Tq))[:, None]
            s = s.masked_fill(j > i + (Tk - Tq), -math.inf)
        rows.append(torch.logsumexp(s, -1))
    return out.to(q.dtype), torch.cat(rows, -1)
'''
