"""Lab 04, Exercise 2: attention over the whole (T x T) score matrix, with the kernel's trace forged.

The exercise is to read keys one tile at a time with the online softmax, never holding the (Tq x Tk) scores. The
check's evidence of that was a tensor trace the learner's process recorded itself, in the kernel and again in the
witness (where the learner's cells are replayed): this answer switches the recording off in both
(`observe.observed_call` replaced), computes softmax(QK^T)V at once, and earned the exercise's points before
issue 55. Now the witness also runs a causal sequence of 16,384 tokens with its address space bounded by the
grading process (RLIMIT_AS, set from outside through prlimit: no process can raise it again) to 160 MiB above
what it held: the (T x T) float32 scores need 1 GiB, so the call fails there and the cell earns nothing.
"""

KIND = "method evidence reported by the learner's process (lab 04: no N x N scores)"
SETUP = "import math\nimport torch\n"
SOLUTION = '''\
def tiled_attention(q, k, v, causal: bool, block_k: int):
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    qf = q.float()
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    m = torch.full((B, Hq, Tq, 1), -math.inf)
    l = torch.zeros((B, Hq, Tq, 1))
    acc = torch.zeros((B, Hq, Tq, D))
    i = torch.arange(Tq)[:, None]
    for start in range(0, Tk, block_k):
        s = qf @ kf[:, :, start:start + block_k].transpose(-2, -1) / math.sqrt(D)
        if causal:
            j = torch.arange(start, min(start + block_k, Tk))[None, :]
            s = s.masked_fill(j > i + (Tk - Tq), -math.inf)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.exp(s - m_safe)
        l = alpha * l + p.sum(-1, keepdim=True)
        acc = alpha * acc + p @ vf[:, :, start:start + block_k]
        m = m_new
    return (acc / l).to(q.dtype), (m + torch.log(l)).squeeze(-1)
'''
CHECK = "from autograder.lab04 import check_tiled_attention\ncheck_tiled_attention(tiled_attention)\n"
POINTS = 3
ATTACK = '''\
import autograder.judging.observe as _observe
_observe.observed_call = lambda call, options: (call(), {})      # no trace leaves this process

def tiled_attention(q, k, v, causal: bool, block_k: int):
    B, Hq, Tq, D = q.shape
    Tk = k.shape[2]
    group = Hq // k.shape[1]
    kf = k.float().repeat_interleave(group, 1)
    vf = v.float().repeat_interleave(group, 1)
    s = q.float() @ kf.transpose(-2, -1) / math.sqrt(D)
    if causal:
        s = s.masked_fill(~torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq), -math.inf)
    return (torch.softmax(s, -1) @ vf).to(q.dtype), torch.logsumexp(s, -1)
'''
