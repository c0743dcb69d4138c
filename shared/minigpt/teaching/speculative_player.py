"""A speculative-decoding player (lab 06): step through the rounds of one real generation.

    player = SpeculativePlayer(target, draft, prompt_ids, tokenizer, k=4, max_new_tokens=32)
    player                                     # shows itself as the last expression of a cell

Each round shows the drafted tokens with q(t) (draft), p(t) (target) and the acceptance probability
min(1, p/q), marked accepted or rejected, then the token the target adds: resampled from the residual
max(0, p - q) after a rejection, or the bonus token when every draft was accepted. Below: the running
acceptance rate, tokens per round and the speedup the cost model predicts from step costs you pass in.
All text comes from pure functions (`round_rows`, `running_stats`, `round_html`), tested without a browser.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Callable, Sequence

import ipywidgets as W

from minigpt.engine.speculative import Round, generate_speculative, measured_alpha
from minigpt.sampling import SamplingParams

__all__ = ["round_rows", "running_stats", "round_html", "RunningStats", "SpeculativePlayer"]

STATUS_COLORS = {"accepted": "#c8f7c5", "rejected": "#f7c5c5", "resampled": "#fde9a9", "bonus": "#c5dcf7",
                 "not checked": "#eeeeee"}


def round_rows(r: Round, decode: Callable[[list[int]], str]) -> list[dict[str, object]]:
    """One row per drafted token (token text, q, p, min(1, p/q), status), then the target's own token."""
    rows: list[dict[str, object]] = []
    for i, t in enumerate(r.drafted):
        status = "accepted" if i < r.n_accepted else ("rejected" if i == r.n_accepted else "not checked")
        rows.append({"token": decode([t]), "q": r.q[i], "p": r.p[i], "accept": r.accept_probs[i], "status": status})
    last = r.emitted[-1]
    rows.append({"token": decode([last]), "q": None, "p": r.p_last, "accept": None,
                 "status": "bonus" if r.bonus else "resampled"})
    return rows


@dataclass(frozen=True)
class RunningStats:
    rounds: int
    tokens: int
    drafted: int
    accepted: int
    alpha: float                # accepted / tested drafts (minigpt.engine.speculative.measured_alpha)
    tokens_per_round: float
    predicted_speedup: float    # tokens * t_target / (rounds * (k t_draft + t_verify)), from the step costs given


def running_stats(rounds: Sequence[Round], upto: int, *, target_step_s: float, draft_step_s: float,
                  verify_s: Callable[[int], float]) -> RunningStats:
    """Statistics of rounds[0:upto]; the speedup prices each round at k_round * t_draft + t_verify(k_round)."""
    if not 0 <= upto <= len(rounds):
        raise ValueError(f"upto must be in [0, {len(rounds)}], got {upto}")
    done = list(rounds[:upto])
    tokens = sum(len(r.emitted) for r in done)
    cost = sum(len(r.drafted) * draft_step_s + verify_s(len(r.drafted)) for r in done)
    return RunningStats(rounds=upto, tokens=tokens, drafted=sum(len(r.drafted) for r in done),
                        accepted=sum(r.n_accepted for r in done),
                        alpha=measured_alpha(done) if done else float("nan"),
                        tokens_per_round=tokens / upto if upto else float("nan"),
                        predicted_speedup=tokens * target_step_s / cost if cost else float("nan"))


def _fmt(x: object) -> str:
    return "" if x is None else f"{x:.3f}"


def round_html(index: int, total: int, rows: list[dict[str, object]], stats: RunningStats, text_before: str,
               text_new: str) -> str:
    """The readout for round `index` (1-based) of `total`."""
    head = "<tr><th>token</th><th>q(t) draft</th><th>p(t) target</th><th>min(1, p/q)</th><th>status</th></tr>"
    body = "".join(
        f"<tr style='background:{STATUS_COLORS[str(r['status'])]}'><td><code>{html.escape(repr(r['token']))}</code></td>"
        f"<td>{_fmt(r['q'])}</td><td>{_fmt(r['p'])}</td><td>{_fmt(r['accept'])}</td><td>{r['status']}</td></tr>"
        for r in rows)
    n_acc = sum(r["status"] == "accepted" for r in rows)
    summary = (f"<b>round {index} of {total}</b>: {len(rows) - 1} drafted, {n_acc} accepted, "
               f"{n_acc + 1} tokens emitted")
    running = (f"after {stats.rounds} rounds: {stats.tokens} tokens, acceptance rate {stats.alpha:.2f} "
               f"({stats.accepted}/{stats.drafted} drafts accepted), {stats.tokens_per_round:.2f} tokens per round, "
               f"cost-model speedup {stats.predicted_speedup:.2f}x")
    text = (f"<pre style='white-space:pre-wrap'>{html.escape(text_before)}"
            f"<span style='background:#c8f7c5'>{html.escape(text_new)}</span></pre>")
    return f"<div>{summary}<table>{head}{body}</table><p>{running}</p>{text}</div>"


class SpeculativePlayer(W.VBox):
    """Buttons and a slider over the rounds of one speculative generation of `target` with `draft`."""

    def __init__(self, target, draft, prompt: Sequence[int], tokenizer, *, k: int = 4, max_new_tokens: int = 32,
                 sampling: SamplingParams = SamplingParams(), target_step_s: float = 1.0, draft_step_s: float = 0.2,
                 verify_s: Callable[[int], float] | None = None) -> None:
        self.prompt = list(prompt)
        self.decode = tokenizer.decode
        self.gen = generate_speculative(target, draft, self.prompt, max_new_tokens, sampling, k=k, stop_token_ids=())
        self.rounds = self.gen.rounds
        self.costs = {"target_step_s": target_step_s, "draft_step_s": draft_step_s,
                      "verify_s": verify_s or (lambda kk: target_step_s)}
        self.slider = W.IntSlider(value=1, min=1, max=len(self.rounds), description="round")
        self.prev = W.Button(description="◀ previous")
        self.next = W.Button(description="next ▶")
        self.readout = W.HTML()
        self.prev.on_click(lambda _: self._step(-1))
        self.next.on_click(lambda _: self._step(+1))
        self.slider.observe(lambda _: self._render(), names="value")
        super().__init__([W.HBox([self.prev, self.slider, self.next]), self.readout])
        self._render()

    def _step(self, delta: int) -> None:
        self.slider.value = min(max(self.slider.value + delta, self.slider.min), self.slider.max)

    def html_for(self, index: int) -> str:
        """The readout of round `index` (1-based)."""
        r = self.rounds[index - 1]
        stats = running_stats(self.rounds, index, **self.costs)
        emitted_before = [t for rr in self.rounds[:index - 1] for t in rr.emitted]
        return round_html(index, len(self.rounds), round_rows(r, self.decode), stats,
                          self.decode(self.prompt[-40:] + emitted_before), self.decode(r.emitted))

    def _render(self) -> None:
        self.readout.value = self.html_for(self.slider.value)
