"""The reasoning questions of README's interview table, as multiple choice with every wrong option diagnosed.

    q = CHOICE_QUESTIONS[4].deal(random.Random(0))   # options in a seeded order, letters A-D
    print(q.text)
    q.grade("b")                                      # Verdict(correct=..., message=why that option is wrong)

Each question asks for the reasoning an interviewer listens for; each wrong option is a belief candidates
actually hold, and its diagnosis says what is wrong with it. `number` is the row in README's table, `lab`
the lab that teaches and grades it.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from autograder.interview.questions import Verdict
from minigpt.costmodel.calculators import (GiB, PRESETS, ModelShape, attention_flops, kv_cache_bytes,
                                          prefill_flops, weight_bytes)
from minigpt.costmodel.hardware import ACCELERATORS
from minigpt.costmodel.offload import LINKS, crossover_tokens
from minigpt.disagg.goodput_sim import SimConfig, costs_for
from minigpt.moe.arithmetic import DEEPSEEK_V3, dispatch_combine_bytes_per_token

# Question 16's figures, computed: one 128k-token request of Llama-3-8B in bf16 on one H100 SXM.
_L3, _H100, _LONG = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"], 131072
_LONG_KV_GIB = kv_cache_bytes(_L3, _LONG, 1, 2) / GiB
_LONG_PREFILL = prefill_flops(_L3, _LONG)
_LONG_ATTENTION_SHARE = attention_flops(_L3, _LONG * (_LONG + 1) // 2) / _LONG_PREFILL
_LONG_PREFILL_S = _LONG_PREFILL / _H100.peak("bf16")
# Question 18's step times (lab 11's simulator, Llama-3-8B on an H100): 32 decodes at 4k context, alone, with a
# prompt chunk filling a 512-token budget, and a whole 4k-token prefill.
_STEP = costs_for(SimConfig())
_CHUNK = 512 - 32
_DECODE_MS = _STEP.decode_step_s(32, 32 * 4096) * 1e3
_MIXED_MS = _STEP.mixed_step_s(32, 32 * 4096, [(0, _CHUNK)]) * 1e3
_WHOLE_MS = _STEP.prefill_s([4096]) * 1e3
# Question 19's wire bytes: DeepSeek-V3 (256 experts, 8 a token) over 64 ranks, FP8 out and BF16 back.
_EP64 = dispatch_combine_bytes_per_token(DEEPSEEK_V3, 64)
# Question 22: a tree's verify is compute-bound once B * nodes positions pass the ridge point (bf16: 2 FLOP per weight
# per position over 2 bytes per weight = 1 FLOP per byte per position)
_TREE_NODES, _RIDGE_H100 = 16, _H100.ridge_point("bf16")
# lab 13: where loading a cached prefix from one NVMe SSD starts to beat recomputing it on an H100 (mfu 0.5)
_NVME = LINKS["NVMe SSD (PCIe 4.0 x4)"]
_CROSS_8B = crossover_tokens(PRESETS["Llama-3-8B"], _NVME, _H100)
_CROSS_MHA = crossover_tokens(PRESETS["Llama-2-7B (MHA)"], _NVME, _H100)
_TREE_BATCH = -(-int(_RIDGE_H100) // _TREE_NODES)
# Question 21's step: Llama-3.2-1B in bf16 at batch 1 on an H100 (weights read once), beside 0.9 ms of scheduling.
_LLAMA_1B = ModelShape("Llama-3.2-1B", n_layers=16, d_model=2048, n_heads=32, n_kv_heads=8, head_dim=64, d_ff=8192,
                       vocab_size=128_256, tie_embeddings=True)
_STEP_1B_MS = weight_bytes(_LLAMA_1B, 2) / _H100.memory_bandwidth * 1e3
_SCHEDULER_MS = 0.9


@dataclass(frozen=True)
class ChoiceQuestion:
    number: int
    topic: str
    lab: str
    question: str
    right: str
    wrong: tuple[tuple[str, str], ...]      # (option, why it is wrong)
    explanation: str

    def deal(self, rng: random.Random) -> "DealtChoice":
        """The options in a seeded order."""
        options = [(self.right, "")] + list(self.wrong)
        rng.shuffle(options)
        return DealtChoice(self, tuple(options))


@dataclass(frozen=True)
class DealtChoice:
    """A ChoiceQuestion with its options in the order shown; answered by letter."""

    source: ChoiceQuestion
    options: tuple[tuple[str, str], ...]

    @property
    def topic(self) -> str:
        return self.source.topic

    @property
    def lab(self) -> str:
        return self.source.lab

    @property
    def letters(self) -> str:
        return string.ascii_uppercase[: len(self.options)]

    @property
    def right_letter(self) -> str:
        return next(letter for letter, (_, why) in zip(self.letters, self.options) if not why)

    @property
    def text(self) -> str:
        lines = [self.source.question]
        lines += [f"  {letter}) {option}" for letter, (option, _) in zip(self.letters, self.options)]
        return "\n".join(lines)

    @property
    def solution(self) -> str:
        return f"{self.right_letter}. {self.source.explanation}"

    def grade(self, answer: str) -> Verdict:
        """Grade a letter ("b", "B", "B)"); never raises."""
        letter = answer.strip().upper()[:1] if isinstance(answer, str) else ""
        if not letter or letter not in self.letters:
            return Verdict(False, f"answer with one letter of {', '.join(self.letters)}; got {answer!r}")
        option, why = self.options[self.letters.index(letter)]
        if not why:
            return Verdict(True, f"{letter}.")
        return Verdict(False, f"{letter} is not right: {why}")


CHOICE_QUESTIONS: tuple[ChoiceQuestion, ...] = (
    ChoiceQuestion(
        1, "KV cache size", "00",
        "Llama-3-8B (GQA: 32 query heads, 8 KV heads) serves 8k-token requests with a bf16 KV cache. Which single "
        "change halves the KV cache of each request?",
        "Store K and V in fp8 (1 byte per element) instead of bf16",
        (("Quantize the weights to int4 with one scale per group",
          "weight quantization shrinks the weights; the KV cache holds activations written at run time, in their own "
          "precision."),
         ("Halve the number of query heads, keeping the 8 KV heads",
          "the cache stores K and V per KV head; query heads never enter it."),
         ("Switch from a contiguous cache to PagedAttention",
          "paging removes fragmentation (at most one partly filled block per request) but stores the same bytes per "
          "token.")),
        "Bytes per token are 2 x layers x KV heads x head_dim x bytes per element; only the last factor changes, "
        "from 2 to 1."),
    ChoiceQuestion(
        2, "Decode is memory-bound", "00",
        "At batch 1, a decode step of an 8B-parameter bf16 model on an H100 is limited by memory bandwidth, not "
        "compute. Why?",
        "Each step reads all 16 GB of weights for about 1 FLOP per byte, far below the H100's ridge point",
        (("Attention over the KV cache costs time quadratic in the context length",
          "one new query attends to the cache in linear time per step, and at batch 1 and short context the weights, "
          "not the cache, are most of the bytes."),
         ("Tensor cores cannot run the matrix-vector products of a batch-1 step",
          "they can; a matrix-vector product simply does 2 FLOPs per weight read, so whatever runs the math waits on "
          "memory."),
         ("The time to launch a few hundred kernels dominates each step",
          "launch overhead dominates tiny models (lab 01's), but reading 16 GB at 3.35 TB/s takes about 5 ms, far "
          "more than the launches.")),
        "A batch-1 step does about 2 FLOPs per 2-byte weight: about 1 FLOP per byte, against an H100's ridge "
        "point (peak FLOP/s over bandwidth) of about 295 FLOP/byte. Batching raises the intensity: B sequences "
        "share one read of the weights."),
    ChoiceQuestion(
        3, "PagedAttention", "02",
        "What problem does PagedAttention solve in a serving engine?",
        "Memory wasted by contiguous per-request reservations: blocks allocated on demand let more requests fit",
        (("Attention arithmetic: reading K and V by blocks makes the kernel faster than FlashAttention",
          "it reads K and V through a block table and does the same FLOPs; the gain is capacity (a larger batch), "
          "not a faster kernel."),
         ("KV cache size: storing K and V in blocks compresses them",
          "blocks hold the same K and V at the same precision."),
         ("GPU memory capacity: it keeps the KV cache in CPU memory and pages it in",
          "that is offloading or swapping; paging is how GPU memory for the cache is allocated.")),
        "Reserving contiguous memory for each request's maximum length wastes most of it (internal and external "
        "fragmentation); fixed-size blocks allocated as tokens arrive waste at most one partly filled block per "
        "request. Blocks also make sharing cheap: requests with a common prefix point at the same blocks."),
    ChoiceQuestion(
        4, "Continuous batching", "03",
        "Why does continuous (iteration-level) batching beat static batching on throughput?",
        "A waiting request takes a finished request's slot at the next step, so the batch stays full",
        (("It spreads each request's decode steps across several GPUs at once",
          "that is model parallelism; batching is about how many requests share one step."),
         ("It lowers the FLOPs needed for each generated token",
          "each token costs the same FLOPs; more tokens share each read of the weights."),
         ("It pads every request to one length so the kernels stay regular",
          "padding is what static batching does, and it wastes compute; continuous batching packs variable "
          "lengths.")),
        "A static batch runs until its longest request finishes: finished slots sit idle and new requests wait. "
        "With output lengths that vary a lot it decodes at a shrinking size; continuous batching keeps it near the "
        "maximum, and a memory-bound decode step barely slows as the batch grows."),
    ChoiceQuestion(
        5, "Online softmax", "04",
        "FlashAttention walks the keys tile by tile. What must it keep for each query row between tiles to produce "
        "the exact softmax-weighted output?",
        "The running max, the running sum of exponentials, and the unnormalised output",
        (("Only the running sum of exponentials of the scores",
          "without the running maximum, exp overflows (or earlier terms cannot be rescaled), and the output "
          "accumulator is needed too."),
         ("The whole row of scores, to normalise once at the end",
          "that is the T x T score matrix FlashAttention exists to avoid writing to memory."),
         ("Nothing: each tile's softmax output is averaged over tiles",
          "averaging per-tile softmaxes weights every tile equally instead of by its share of the exponential "
          "mass.")),
        "Keep m, l = sum exp(s - m) and the accumulator; when the maximum grows, rescale l and the accumulator by "
        "exp(m_old - m_new). Dividing by l at the end gives softmax(S)V exactly; the log-sum-exp m + log l is what "
        "the backward pass and merging partial results (split-K decode, ring attention) need."),
    ChoiceQuestion(
        6, "Attention with a KV cache", "01",
        "During decode with a KV cache, several new tokens (a chunk of Tq queries) attend to a cache of Tk >= Tq "
        "keys that already includes them. Which causal mask is right?",
        "Bottom-right aligned: new query i sees keys 0 .. Tk - Tq + i",
        (("Top-left aligned: query i sees keys 0 .. i",
          "that treats the new queries as the first Tq positions; they are the last Tq, so the mask shifts by "
          "Tk - Tq."),
         ("No mask: the new queries may see every cached key",
          "true for a single new token, but with several new tokens the earlier ones must not see the later ones."),
         ("Lower-triangular over all Tk positions, recomputing every query each step",
          "that recomputes attention for every past query: the work a KV cache exists to avoid.")),
        "The two conventions agree only when Tq = Tk (prefill from nothing); with a cache, and in chunked prefill "
        "or speculative verification, the queries sit at the end."),
    ChoiceQuestion(
        7, "FP8 E4M3 vs E5M2", "05",
        "FP8 comes as E4M3 and E5M2. Which is used for what, and why?",
        "E4M3 for weights and activations (precision); E5M2 for gradients (range)",
        (("E5M2 for weights and activations (precision); E4M3 for gradients (range)",
          "reversed: E5M2's 2 mantissa bits are too coarse for weights; its range suits gradients."),
         ("Either, interchangeably: E5M2 is just the more precise of the two",
          "it has one mantissa bit fewer; it trades precision for range."),
         ("Either: they differ only in how they encode infinities and NaN",
          "they split the 7 non-sign bits differently between exponent and mantissa, which changes both range "
          "and precision.")),
        "E4M3 has 3 mantissa bits and a largest finite value of 448; E5M2 has 2 mantissa bits and reaches 57344. "
        "Inference engines use E4M3 with a per-tensor or per-channel scale for weights, activations and often the "
        "KV cache."),
    ChoiceQuestion(
        8, "GPTQ vs AWQ", "05",
        "How do GPTQ and AWQ differ?",
        "GPTQ corrects rounding error column by column; AWQ rescales salient channels, then rounds",
        (("GPTQ quantizes weights, AWQ quantizes activations, both to 4 bits",
          "both are weight-only methods; activations stay in 16 bits."),
         ("Both round to nearest; AWQ just needs no calibration data",
          "AWQ also runs calibration data, to find the salient channels from activation magnitudes."),
         ("GPTQ retrains with quantization in the loop; AWQ rounds after training",
          "that is quantization-aware training; GPTQ is post-training and uses no gradients.")),
        "GPTQ quantizes a layer's weights one column at a time and updates the columns not yet quantized to cancel "
        "the error, using second-order statistics (X^T X) of calibration activations. AWQ keeps round-to-nearest "
        "but first scales up the input channels that calibration activations show to be salient. Both matter most "
        "at low bit widths and on models with outlier channels."),
    ChoiceQuestion(
        9, "Speculative accept/reject", "06",
        "In speculative sampling with draft distribution q and target p, a drafted token x is kept with what "
        "probability, and what happens when it is rejected?",
        "min(1, p(x)/q(x)); on rejection, sample from max(0, p - q) renormalised",
        (("1 if x is the target's most likely token, else 0; on rejection, take that token",
          "that is greedy verification: exact only at temperature 0."),
         ("min(1, q(x)/p(x)); on rejection, sample from max(0, p - q) renormalised",
          "inverted: tokens the draft proposes more often than the target would must be kept less often."),
         ("min(1, p(x)/q(x)); on rejection, sample a fresh token from p",
          "the mass already accepted would be counted twice; the residual max(0, p - q) corrects for it.")),
        "P(x emitted) = q(x) min(1, p(x)/q(x)) + P(reject) * residual(x) = p(x): every emitted token is exactly "
        "distributed as the target's."),
    ChoiceQuestion(
        10, "When speculation does not pay", "06",
        "When does speculative decoding fail to make decoding faster?",
        "Low acceptance, a costly draft, or large batches where the target step is compute-bound",
        (("Whenever sampling at a temperature above 0, since only greedy can be verified",
          "speculative sampling is exact at any temperature through min(1, p/q) and the residual."),
         ("Never: the output is the target's, so it always helps",
          "identical output says nothing about speed; a round costs k draft steps plus one verification."),
         ("When the prompt is long, since speculation slows the prefill",
          "prompt length affects prefill, which speculation does not touch; acceptance, draft cost and whether "
          "the target step is memory-bound decide.")),
        "Speedup = E[tokens per round] x t_target / (k t_draft + t_verify). At batch 1, t_verify is about one "
        "target step; at a compute-bound batch, verifying k + 1 tokens per sequence costs nearly k + 1 steps."),
    ChoiceQuestion(
        11, "Tensor vs pipeline parallelism", "07",
        "Serving a 70B model on 8 GPUs in one node for low latency, why is tensor parallelism usually chosen over "
        "pipeline parallelism?",
        "TP makes each token's step faster; with PP a token still crosses every stage in turn",
        (("PP needs more memory per GPU than TP for the same model",
          "each PP stage holds an eighth of the layers; the weights per GPU are about the same."),
         ("TP sends fewer bytes between GPUs per token than PP",
          "TP sends more (two all-reduces of d_model per layer against one activation per stage boundary); it wins "
          "on latency despite that."),
         ("PP cannot batch requests, so its GPUs sit idle",
          "it can, with micro-batches in flight in different stages; that raises throughput, not one token's "
          "latency.")),
        "TP splits every layer's matmuls, so each GPU reads an eighth of the weights per token, at the price of two "
        "all-reduces per layer over fast NVLink. With PP each GPU holds whole layers and a token passes the stages "
        "in turn, so its latency does not drop. Across nodes, where links are slower, engines combine them: TP "
        "inside a node, PP between nodes."),
    ChoiceQuestion(
        12, "A gateway for 100k requests/s", "08",
        "A gateway spreads 100k requests/s over many engine replicas; most requests start with one of a few "
        "hundred long system prompts. Which routing policy serves most prompts from the prefix cache without "
        "overloading a replica?",
        "Consistent hashing on the prompt's first blocks, spilling to the next replica when overloaded",
        (("Round-robin over the replicas, which keeps their load even",
          "it spreads load evenly, but every prefix then misses once on every replica and is stored on all of "
          "them."),
         ("Consistent hashing on the whole prompt, for the best affinity",
          "the user's part differs in every request, so requests sharing a system prompt scatter."),
         ("hash(prompt's first blocks) % number of replicas",
          "adding or removing a replica remaps almost every prefix and empties the caches; a consistent-hash ring "
          "moves about 1/N of them.")),
        "Hash the first KV blocks onto a consistent-hash ring and send each request to its prefix's replica unless "
        "it is overloaded; bound each replica's queue and answer 429 beyond it. Pure affinity can pile a hot prefix "
        "onto one replica (lab 08's routing run shows it); the load bound trades a few misses for balance."),
    ChoiceQuestion(
        13, "Prefix caching for chat", "02",
        "Why is prefix caching so effective for chat APIs?",
        "Each turn resends the history, whose KV was computed last turn: its prefill is skipped",
        (("It caches the answers to questions users repeat",
          "that would be a response cache; prefix caching reuses the KV of prompt prefixes and still generates "
          "the answer."),
         ("It compresses the conversation history's KV cache",
          "the cached blocks hold the same K and V; nothing is compressed."),
         ("It makes every decode step of a long chat faster",
          "decode still reads each sequence's whole cache; the saving is the prefill of the shared prefix.")),
        "Every turn resends the system prompt and the whole history, most of which was prefilled last turn; reusing "
        "its KV blocks skips that prefill and cuts time to first token. The longer the shared prefix relative to the "
        "new turn, the larger the saving; blocks are matched by a chained hash of their tokens."),
    ChoiceQuestion(
        14, "Latency fine, throughput low", "03",
        "Time per output token is fine but throughput is low, and most GPU memory sits unused. What do you change "
        "first?",
        "Raise the batch limits and give the KV pool the free memory, so more sequences decode at once",
        (("Add tensor parallelism so each decode step runs on more GPUs",
          "TP lowers latency by splitting weights across GPUs and spends bandwidth on all-reduces; throughput per "
          "GPU usually drops."),
         ("Quantize the weights to int4 so each decode step reads fewer bytes",
          "it speeds each step, but the problem named is a small batch with memory to spare; batching is the "
          "larger lever here."),
         ("Turn on speculative decoding with a larger k to emit more tokens per step",
          "speculation spends extra compute to cut latency at small batches; for throughput it competes with the "
          "batch for the same compute.")),
        "While decode is memory-bound, a larger batch adds tokens per step at almost the same step time: "
        "throughput grows almost linearly with the batch until the step becomes compute-bound (the critical batch) "
        "or the KV pool runs out. The knobs: maximum sequences, maximum batched tokens, memory for the KV pool."),
    ChoiceQuestion(
        15, "100 LoRA adapters", "08",
        "How would you serve 100 LoRA adapters of one base model?",
        "One base model; small A, B factors per adapter; mixed batches with a gathered LoRA matmul",
        (("Merge each adapter into its own copy of the base weights and route by adapter",
          "that is 100 copies of the model, and each batch can then serve only one adapter."),
         ("One base model; batch one adapter's requests at a time, switching adapters between batches",
          "batches shrink to one adapter's traffic and requests wait for their turn; mixed batches stay full."),
         ("One base model with all 100 adapters merged into its weights",
          "that changes every adapter's behaviour: their updates add up.")),
        "Keep one copy of the base weights and each adapter's A and B factors (a rank-r adapter adds r (d_in + "
        "d_out) parameters per adapted matrix: megabytes against gigabytes), resident or paged in from CPU memory, "
        "and batch requests for different adapters with a gathered matmul that applies each row's adapter "
        "(BGMV/SGMV, as Punica and S-LoRA do)."),
    ChoiceQuestion(
        16, "Serving a 128k context", "09",
        "One request brings a 128k-token prompt to Llama-3-8B (bf16) on one H100. What dominates its time to first "
        "token, and what do serving engines do about it?",
        "Prefill compute, quadratic in length: engines chunk it, and split it across GPUs for longer contexts",
        (("Decode: each step re-reads the whole cache, so the first token comes quickly",
          f"the first token waits for the whole prefill: {_LONG_PREFILL / 1e15:.1f} PFLOP, at least "
          f"{_LONG_PREFILL_S:.1f} s at an H100's dense bf16 peak."),
         ("Nothing special: the model supports 128k tokens, so the engine just runs it",
          f"its KV cache alone is {_LONG_KV_GIB:.0f} GiB, which limits the batch, and an unchunked prefill of that "
          "length stalls every other request's decode steps."),
         ("Keep only the last 4k tokens in a sliding window, which costs nothing",
          "that changes the model's answers unless it was trained with a window: Llama-3 attends to the whole "
          "context.")),
        f"Prefill of {_LONG:,} tokens is {_LONG_PREFILL / 1e15:.1f} PFLOP, {_LONG_ATTENTION_SHARE:.0%} of it "
        f"attention (quadratic in length), at least {_LONG_PREFILL_S:.1f} s on one H100; the KV cache is "
        f"{_LONG_KV_GIB:.0f} GiB. Engines split the prefill into chunks scheduled beside other requests' decodes, "
        "and for longer contexts spread it over GPUs (context parallelism, ring attention)."),
    ChoiceQuestion(
        17, "Guaranteed JSON", "10",
        "A caller sends a JSON Schema and expects every reply to validate. How does a serving engine guarantee it, "
        "and why does it not slow decoding down?",
        "A grammar compiled from the schema masks the logits each step, computed on CPU threads while the GPU runs "
        "the step: verdicts cached per grammar position, or a lexer and a token-trie walk fast enough to need no cache",
        (("Ask for JSON in the prompt, then validate the reply and retry until it passes",
          "a retry costs a whole generation and nothing bounds how many are needed; the reply is not valid by "
          "construction."),
         ("Mask the logits by running every vocabulary token's text through the grammar at each step",
          "that is right but slow: a scan reads every token's text, 128k of them a step; engines walk a token trie "
          "and cache the verdicts decided by the grammar position alone."),
         ("Generate freely, then repair the output into the nearest valid document",
          "a repaired document is not what the model wrote (values get invented or dropped), and repairing a "
          "schema's constraints in general is as hard as generating under them.")),
        "The schema becomes a grammar run by a parser; at each step the tokens it refuses get logit -inf, so the "
        "output is valid by construction (unless the token limit cuts it short). Two ways keep the mask cheap, on CPU "
        "threads while the GPU runs the step. XGrammar: for most tokens the verdict depends only on the parser's "
        "position inside the current rule, so it computes those once per position at compile time (a cost that grows with "
        "the schema) and checks the few context-dependent tokens at run time. llguidance "
        "(behind OpenAI's structured outputs for JSON Schema): no precomputation; a lexer over regular expressions "
        "and an Earley parser walk the token trie each step, about 50 us a token for a 128k vocabulary by its "
        "README."),
    ChoiceQuestion(
        18, "Disaggregated prefill and decode", "11",
        "An 8B model serves 4k-token prompts on four identical GPUs, each running continuous batching, and under load "
        "users see the token stream stutter. Someone proposes splitting the GPUs into prefill workers and decode "
        "workers. What do you do first, and when does a split pay?",
        "Chunk the prefill first, with a step budget small enough that chunks ride in the decode steps; split for "
        "what that cannot give (a parallelism or GPU type per phase, decode isolated from prefill load), never for "
        "throughput",
        (("Split them: decode GPUs then never wait on a prefill, which ends the stutter at the same throughput",
          "that is the answer against an engine that prefills whole prompts (the vLLM DistServe measured against). "
          "With chunked prefill, which vLLM's V1 engine always runs, a step carries a slice of the prompt beside the "
          "decodes, and on identical GPUs the chunked engine ties or beats every split (lab 11, section 4): the "
          "split is not the first fix, and its reasons lie elsewhere."),
         ("Always split: separating the two phases raises what the same GPUs can serve",
          "every request still needs the same prefill FLOPs and decode steps wherever they run; vLLM's documentation "
          "says disaggregated prefill does not improve throughput, and a fixed split leaves one pool idle when the mix "
          "of work changes."),
         ("Raise --max-num-batched-tokens so that each prompt is prefilled in a single step",
          "a budget that admits a whole 4k-token prompt beside the decodes brings the stall back (vLLM's default of "
          "8192 on an H100 already does); a stuttering stream asks for a smaller budget, so that each step carries "
          "only a slice of a prompt.")),
        f"A decode step reads every weight to make one token per request and leaves most of the GPU's FLOPs idle. On "
        f"an H100, a step of 32 Llama-3-8B requests at 4k context takes {_DECODE_MS:.1f} ms; the same step carrying a "
        f"{_CHUNK}-token prompt chunk {_MIXED_MS:.1f} ms; a whole 4k-token prefill stalls every decode for "
        f"{_WHOLE_MS:.0f} ms. So chunked prefill (vLLM's budget is --max-num-batched-tokens) hides most of the "
        "interference that disaggregation was invented to remove. A split still pays where one engine cannot do "
        "what two pools can: a different tensor or expert parallelism per phase (DistServe, DeepSeek's prefill at EP "
        "32 and decode at EP 144), different GPUs per phase (Splitwise), decode steps no prefill load lengthens, and "
        "a KV cache pool shared across the cluster (Mooncake). It costs the KV cache's bytes on the wire, mostly "
        "hidden when sent layer by layer, and it never raises throughput: the same work is done, only placed apart."),
    ChoiceQuestion(
        19, "Expert parallelism", "11",
        "A mixture-of-experts model with 256 routed experts, 8 per token, is served with expert parallelism over 64 "
        "GPUs. Besides the expert matmuls themselves, what sets how long one MoE layer takes?",
        "Two all-to-alls (each token's vector to the GPUs holding its experts, and the results back) and the busiest "
        "GPU: the layer waits for the rank whose experts drew the most tokens, so hot experts get replicas",
        (("Nothing beyond the active parameters: it runs like a dense model of that size",
          "the experts are spread over 64 GPUs, so every token's hidden vector crosses the network to up to 8 other "
          f"ranks and back, about {_EP64.total / 1e3:.0f} kB per token per layer for DeepSeek-V3 "
          f"({_EP64.dispatch / 1e3:.0f} kB out in FP8, {_EP64.combine / 1e3:.0f} kB back in BF16), and the ranks "
          "wait for each other."),
         ("Each GPU runs its 4 experts on every token of the batch",
          "a GPU runs its experts only on the tokens routed to them; that is the dispatch: running every expert on "
          "every token is the dense reference, E / k times the work."),
         ("Only the all-to-all's bandwidth: tokens spread evenly, so every GPU does the same work",
          "learned routing is skewed; the slowest rank sets the layer's time, which is why DeepSeek serves with 32 "
          "redundant experts and EPLB replicates the hot ones.")),
        "Dispatch sends each token to the ranks that own its chosen experts (once per rank when several are "
        "co-located), the experts run on what arrived, and combine brings the weighted results home: two all-to-alls "
        "a layer, priced by d_model elements per remote rank (DeepEP sends FP8 out and BF16 back). Every rank waits "
        "for the slowest, so load balance matters as much as bandwidth: EPLB gives spare slots to the experts with the "
        "most tokens per replica and packs the replicas greedily; a capacity factor caps what an expert accepts and "
        "drops the rest."),
    ChoiceQuestion(
        20, "Deterministic inference", "12",
        "The same prompt, temperature 0, sent to a busy vLLM server twice, comes back with two different answers. "
        "Why, and what makes the answers repeat?",
        "A request's logits depend on the batch it shares a step with: libraries choose a reduction order (and a kernel) "
        "by shape, and floating-point sums depend on their order; batch-invariant kernels fix every reduction's order "
        "independently of the batch (vLLM's VLLM_BATCH_INVARIANT, SGLang's --enable-deterministic-inference), at a cost",
        (("Sampling is random even at temperature 0; a fixed seed makes it repeat",
          "temperature 0 is the argmax, no random draw at all; the logits themselves change with the batch, so the "
          "argmax can flip where two tokens are close, seed or no seed."),
         ("GPUs finish their threads in a random order, so every run differs; nothing can be done on a GPU",
          "the same batch run twice gives the same bits: kernels that would depend on timing (atomics) are not in a "
          "forward pass; what changes from run to run is the batch, and fixing each reduction's order for every batch "
          "makes the output repeat (lab 12 measures it: a request alone and batched with three others differ at "
          "nearly every step, and not at all in batch-invariant mode)."),
         ("Turn off batching: serve one request at a time",
          "that repeats, but throws away what batching buys (lab 03: several times the throughput); batch-invariant "
          "kernels keep batching and the same bits.")),
        "Float addition is not associative, and a matmul, a norm or an attention kernel picks how to split its sums by "
        "the shapes it is given: the number of rows in the step, how many keys a sequence has, how a prefill is "
        "chunked. A request's row then gets other bits in another batch, and greedy decoding diverges where two "
        "candidates are near. The fix fixes the order: tiles of one shape whatever the number of rows (no split of "
        "the reduction dimension that depends on the batch), attention over KV in blocks of a fixed size rather than a "
        "fixed number of splits. It costs the fastest kernel for each shape: Thinking Machines Lab measured 61.5% "
        "slower, SGLang 34.35% (September 2025), the course's CPU engine 0.36x at batch 1 and 0.93x at 8."),
    ChoiceQuestion(
        21, "Engine overheads: graphs and overlap", "12",
        "A 1B model on an H100 decodes one request at a tenth of what its memory bandwidth allows, and a profile shows "
        "the GPU idle most of the time. What do you try, and why does it work there?",
        "Capture the decode step in CUDA graphs (or compile it) for a set of batch sizes, and overlap the scheduler "
        "with the GPU: the step's time is the CPU's launches and scheduling, not the GPU's work",
        (("Quantize the weights to INT4: four times fewer bytes to read",
          f"the step at the bandwidth roofline is already only {_STEP_1B_MS:.2f} ms; a GPU idle most of the time is "
          "waiting for the CPU (launching hundreds of small kernels, scheduling the next step), which fewer bytes do "
          "not shorten."),
         ("Raise the batch size: the idle time is the GPU waiting for work",
          "more requests fill each step, which raises throughput, but a single request's latency stays the CPU's "
          "launch and scheduling time per step; the question's request decodes alone."),
         ("Nothing: a 1B model is too small for an H100",
          "small models are where the CPU's per-step costs dominate, and where graphs and overlap pay the most "
          "(lab 01 measured a CUDA-graph decode several times eager on an H200).")),
        f"Llama-3.2-1B's bf16 weights take {_STEP_1B_MS:.2f} ms to read at an H100's bandwidth. An eager step launches "
        "every operation from Python (microseconds each, hundreds a step); a CUDA graph replays the whole step with one "
        "launch, but only for the shapes it was captured with, so engines pad a batch to the next capture size "
        f"(vLLM's cudagraph_capture_sizes). A scheduler taking {_SCHEDULER_MS} ms a step serially leaves the GPU idle "
        f"{_SCHEDULER_MS / (_STEP_1B_MS + _SCHEDULER_MS):.0%} of the time; overlapped (SGLang's zero-overhead "
        "scheduler, vLLM's async scheduling), the next step is scheduled while this one runs, with placeholders for "
        "its tokens, and the step takes the longer of the two instead of their sum."),
    ChoiceQuestion(
        22, "Draft heads and token trees", "06",
        "An EAGLE head drafts a chain of 5 tokens for Llama 3.1 8B on an H100 at batch 1. A colleague proposes verifying a "
        f"tree of {_TREE_NODES} candidate tokens each round instead. When does the tree pay, and why do engines shrink "
        "trees and switch speculation off as the batch grows?",
        f"At batch 1 the target over {_TREE_NODES} positions still costs about one memory-bound step, so siblings that "
        "rescue a wrong first guess come nearly free; the verify's positions multiply with the batch, and once they "
        "pass the ridge point the extra nodes cost full compute",
        (("Always: the tree is verified in one forward pass whatever its size",
          f"one pass, but it costs what it computes once it is compute-bound: bf16 weights give {_TREE_NODES} FLOP per "
          f"weight byte per request in the tree, and the H100's ridge point is {_RIDGE_H100:.0f}, passed from a batch of "
          f"{_TREE_BATCH} (lab 06 measured the course target over 11 positions at almost two steps on a 2-core CPU)."),
         ("Never with sampling: a tree of candidates changes the output distribution, so trees are greedy-only",
          "recursive rejection sampling tries the siblings in order against the residual and keeps the target's "
          "distribution exactly (lab 06's chi-square test passes for trees as for chains)."),
         ("When the head is accurate: a good head makes the tree's extra branches pay",
          "the more often the first guess is right, the less the siblings add; trees pay where the head hesitates "
          "between a few tokens, and only while the extra positions are nearly free.")),
        "A round costs depth head calls plus one target forward over the tree's nodes and earns the accepted path plus "
        "one token. At batch 1 the target reads its weights once whatever the number of positions, so a tree that "
        "accepts more tokens a round wins (SGLang's EAGLE defaults grow 5 levels, 4 children a node, verify 8 nodes). "
        f"In a batch of B requests the verify runs B x nodes positions: with {_TREE_NODES} nodes an H100 reaches its "
        f"ridge point ({_RIDGE_H100:.0f} FLOP/byte in bf16) at B = {_TREE_BATCH}, and every position beyond costs "
        "compute the batch would have spent on real tokens. Engines narrow the tree, draft fewer tokens, or stop "
        "speculating at large batches (vLLM's disable_by_batch_size)."),
    ChoiceQuestion(
        23, "Radix prefix cache and cache-aware scheduling", "13",
        "SGLang keeps cached prefixes in a radix tree, vLLM in a table of chained block hashes. What does the tree "
        "change, and how should the scheduler use it?",
        "Both find the same longest cached prefix in whole blocks and both evict least recently used blocks nobody "
        "holds; the tree makes the shared structure explicit, so the scheduler can admit the requests with the longest "
        "cached prefix first (with a bound against starvation) while that prefix is still cached",
        (("The tree hits far more often: a hash table cannot find prefixes",
          "a chained hash per block finds the same longest prefix, block by block; lab 13 replays a conversation trace "
          "and both caches reach the ideal hit rate once the pool holds the working set, and stay within a few points "
          "of each other below it: eviction order, not the data structure, decides the hit rate."),
         ("The tree stores each token once, so it needs less GPU memory than paged blocks",
          "the tree's edges hold the same KV blocks the pool holds; what it adds is metadata (nodes, stamps), not "
          "savings in KV bytes."),
         ("Longest prefix first is always best: admit the most cached request every step",
          "alone it starves requests that share nothing with anybody; a waiting-time bound (or aging) puts them "
          "ahead, and SGLang falls back to first come first served when more than 128 requests wait (v0.5.23), where "
          "matching every prompt costs too much.")),
        "A radix tree walks a prompt down edges of blocks and splits an edge where prompts part; a hash table hashes "
        "each block with its parent's hash. Either gives the longest cached prefix in whole blocks, and either evicts "
        "unreferenced blocks least recently used first (leaves of the tree, the front of vLLM's free queue). The tree "
        "lets the scheduler see what is cached as structure: ordering the waiting queue by cached prefix length turns "
        "hits FCFS loses to eviction into saved prefill (lab 13: a higher hit rate and a lower TTFT on a tight pool), "
        "and requests sharing a prefix run together; a starvation bound keeps the longest wait finite."),
    ChoiceQuestion(
        24, "Offload or recompute evicted KV", "13",
        "An engine evicts KV blocks from GPU memory under load. Should it keep them in CPU memory or on an SSD and "
        "load them back, or recompute the prefix, and when does a hierarchical cache not pay?",
        "Compare bytes over the link with the prefill FLOPs at the GPU's achieved rate: for GQA models of billions of "
        "parameters loading wins from the first tokens, even from an SSD; it loses for models whose KV is large "
        "against their FLOPs, over slow or badly used links, and whenever the hot prefixes fit on the GPU anyway",
        (("Always recompute: GPUs are fast and PCIe is slow",
          f"Llama-3-8B's prefill at half an H100's bf16 peak is slower than reading its KV back from one NVMe SSD "
          f"from {_CROSS_8B} tokens on: its KV (GQA, 8 KV heads) is small against the FLOPs that made it."),
         ("Always load: a copy is cheaper than any computation",
          f"a multi-head model has four times the KV of its GQA sibling: Llama-2-7B's prefix from one NVMe SSD loads "
          f"faster than it recomputes only from {_CROSS_MHA:,} tokens, far beyond its context; and a transfer path "
          "that moves many small pages reaches a fraction of the link (SGLang issue 7059)."),
         ("It depends only on the hit rate",
          "the hit rate says how often there is something to load; whether loading beats recomputing is the cost "
          "of each, bytes over a link against FLOPs over a peak.")),
        "Loading L tokens costs latency + L x KV bytes per token / link bandwidth; recomputing costs the prefill's "
        "FLOPs / (peak x MFU), which grows a little faster than L. Short prefixes recompute, long ones load; the "
        "crossover is the shortest L at which loading wins (lab 13 computes it per model and link and measures both "
        "on a CPU). When loading pays, the copies overlap other work and the prefill waits for their events (SGLang's "
        "HiCache loads layer by layer). It does not pay when the working set fits in GPU memory, when hits are rare, "
        "or when the transfers use the link badly."),
)
