"""Speculative decoding: what drafts a reply's next tokens, and how many are worth checking.

A drafter guesses the tokens after the reply so far: prompt lookup (``ngram``: the tokens that
followed the last time the conversation had these tokens) or a small draft model with the same
vocabulary (``draft_model``). The target then evaluates its last token and the draft in one
``llama_decode`` and samples each position in order with the turn's own sampler (``verify``):
every token it keeps is the token it would have sampled one at a time, so speculation changes
the speed of a reply, never the reply.

A check of k drafted tokens costs more than one plain decode (on this kind of CPU one drafted
position adds about 0.4 of a decode, sixteen about 5: the first positions cost the most; on a
GPU almost nothing), and pays only for the drafts that are right. ``DraftPolicy`` weighs the two: how often drafts are right (per drafter and, for prompt
lookup, per match length, which tells a copied passage from a common phrase), and what a check
costs on this machine (timed as the engine decodes), and drafts only as many tokens as are
expected to save time. So prose, where lookups match short common phrases that the reply then
leaves, costs next to nothing, and edits that copy long passages draft long runs. Within a turn
the draft length also follows the hits: it starts at ``START_LENGTH``, doubles after a draft
accepted whole (up to ``MAX_LENGTH``; gains flatten past ~8) and falls back after a miss; a
lookup that matches far back (a passage being copied) may draft as far as it matches at once.

Modes (``[engine] speculative``): ``auto`` (prompt lookup, and the draft model where one is
configured, both only where the policy expects a gain), ``ngram`` (prompt lookup only),
``draft`` (the draft model only, drafting wherever it is confident even if the policy expects
no gain: for measuring a pairing), ``off``. Memories that cannot drop the cells of rejected
drafts (recurrent, hybrid, window-size caches) turn it off, and say why. A turn sampled with a
fixed seed is not drafted (``reproducible_with_drafts``), except where checks round exactly as
single decodes do (flash attention on one CPU thread: ``LlamaRuntime.exact_checks``).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from localchat.engine.draft_model import DraftModel, DraftPlan, load_draft, plan_draft
from localchat.engine.ngram import MAX_MATCH, TokenLog, lookup
from localchat.engine.options import EngineOptions, Sampling
from localchat.errors import EngineError
from localchat.settings import Speculative

if TYPE_CHECKING:
    from localchat.engine.runtime import LlamaRuntime
    from localchat.models.gguf import GGUFInfo

START_LENGTH = 4
MAX_LENGTH = 16
# A draft is checked only if it is expected to produce this many times the tokens per second of
# plain decoding: the estimates are noisy, and a check that only breaks even is not worth it.
MIN_GAIN = 1.05
# What a check of d drafted tokens costs beyond one plain decode, in plain decodes, until the
# engine has timed its own (then the curve is scaled to what it measured): on a 2-core CPU with
# the test model a check of 2, 3, 5, 9 and 17 tokens took 1.42, 1.98, 2.80, 4.2 and 6.0 single
# decodes. Not a straight line: the first drafted position costs most (a batch of several
# tokens takes other kernels than one), later ones less and less, so long drafts of a copied
# passage pay where the cost of short ones would say they cannot.
PRIOR_CHECK_COST = ((1, 0.42), (2, 0.98), (4, 1.8), (8, 3.2), (16, 5.0))
# Checks timed before their times scale the prior curve, and checks of one size timed before
# their own median replaces it.
MEASURED_AFTER = 3
OWN_AFTER = 8
# How fast old drafts' outcomes fade (per draft checked).
DECAY = 0.95
# A drafter the policy has stopped using is still tried now and then (a short draft after this
# many skipped chances): its hit rate can only change through drafts.
EXPLORE_EVERY = 32
EXPLORE_LENGTH = 2
# Decode times are judged by the median of the last few: on a busy machine one decode now and
# then takes many times its usual time, and a mean would let one such outlier decide.
RECENT_TIMES = 31


def plan_speculation(options: EngineOptions, gguf: GGUFInfo,
                     target_name: str) -> tuple[DraftPlan | None, str | None]:
    """Before the target loads: the draft model to load after it (its VRAM is kept free by
    the target's offload plan), or why the configured one cannot be used (a notice)."""
    if options.speculative not in ("auto", "draft") or not options.draft_model:
        return None, None
    kind = gguf.memory_kind
    if kind in ("recurrent", "hybrid") or (kind == "swa" and not options.swa_full):
        return None, None  # no speculation at all: build_speculator says why
    try:
        return plan_draft(options.draft_model, options, target_name), None
    except EngineError as exc:
        return None, str(exc)


def build_speculator(options: EngineOptions, runtime: LlamaRuntime, target: GGUFInfo,
                     plan: DraftPlan | None, problem: str | None,
                     target_name: str) -> tuple[Speculator, list[str]]:
    """The loaded target's Speculator, its draft model loaded (``plan``), and the one-line
    notices of what could not be used: the chat goes on without it."""
    mode = options.speculative
    off_reason = memory_reason(runtime.memory_kind) if runtime.needs_checkpoints else None
    fallback = ("speculation goes on with prompt lookup only" if mode == "auto"
                else "speculative decoding is off")
    notices = [f"{problem}; {fallback}"] if problem else []
    draft = None
    if plan is not None and off_reason is None:
        try:
            draft = load_draft(plan, options, runtime, target_name)
        except EngineError as exc:
            notices.append(f"{exc}; {fallback}")
    if off_reason is not None and mode != "off":
        notices.append(off_reason)
    elif mode == "draft" and draft is None and not notices:
        notices.append('speculative = "draft" needs a draft model: set draft_model under '
                       "[engine]; speculative decoding is off")
    cost = plan.gguf.file_size / target.file_size if plan is not None and target.file_size else None
    speculator = Speculator(mode, off_reason, draft, runtime.is_end_of_generation, cost,
                            exact_checks=runtime.exact_checks)
    return speculator, notices


def memory_reason(memory_kind: str) -> str | None:
    """Why a model with this memory cannot speculate (its rejected drafts' cells cannot be
    dropped exactly), or None."""
    if memory_kind in ("recurrent", "hybrid"):
        return (f"speculative decoding is off: this model's {memory_kind} memory cannot drop "
                "the cells of rejected drafts")
    if memory_kind == "swa":
        return ("speculative decoding is off: this model's window-size cache cannot drop the "
                "cells of rejected drafts; set swa_full = true under [engine] to use it")
    return None


@dataclass
class Acceptance:
    """How often a drafter's tokens are right, as the chance that each next drafted token is
    accepted when the ones before it were (a geometric model: a draft of k with a accepted is a
    successes and, if a < k, one failure), from a prior and recent drafts."""

    hits: float
    misses: float

    @classmethod
    def prior(cls, rate: float, weight: float = 4.0) -> Acceptance:
        return cls(rate * weight, (1.0 - rate) * weight)

    @property
    def rate(self) -> float:
        return self.hits / (self.hits + self.misses)

    def record(self, drafted: int, accepted: int) -> None:
        self.hits = self.hits * DECAY + accepted
        self.misses = self.misses * DECAY + (1.0 if accepted < drafted else 0.0)


def _ngram_bucket(match: int) -> int:
    """Match lengths grouped so that each group sees enough drafts to learn from."""
    for i, upper in enumerate((2, 3, 5, 9, MAX_MATCH - 1)):
        if match <= upper:
            return i
    return 5


# Priors per match-length group: a two-token key is usually a common phrase, a long match a
# passage being copied (rates learned on bench --speculative's set with the test model: 0.3,
# 0.4, 0.68, 0.77, 0.92, 0.996). Right after a draft accepted whole the reply is usually still
# copying: that state has its own rate (``DraftPolicy.streak``), which ramps a copy up at once
# instead of waiting for each longer match length to prove itself.
_NGRAM_PRIORS = (0.3, 0.4, 0.55, 0.7, 0.85, 0.93)
# What the match points into tells more than its length: a reply that matches the conversation
# before it (an edit copying the user's text) is copying, one that matches its own earlier
# tokens repeats a phrase. Measured in hindsight on the greedy replies of bench --speculative's
# set (test model): two-token matches into the prompt were followed on with a rate of 0.88 in
# edits (0.36 in prose), into the reply itself 0.39 (0.16 in prose).
_HISTORY_PRIORS = (0.75, 0.8, 0.85, 0.88, 0.9, 0.93)
_STREAK_PRIOR = 0.9
# An edit: the reply leaves the passage it copies for a word or two, then goes on copying it a
# little further on. A lookup whose match continues the source at most RESUME_GAP tokens after
# where the last accepted draft ended is that copy resuming (its own rate, ``DraftPolicy.resume``),
# not a common phrase that happens to recur.
RESUME_GAP = 8
_RESUME_PRIOR = 0.75
# Where a prompt-lookup draft comes in a copy: right after a draft accepted whole, or resuming
# after an edit (None: neither, the match length and what it points into decide).
CopyState = Literal["streak", "resume"]


class RecentTimes:
    """The median of the last RECENT_TIMES values (None before the first)."""

    def __init__(self) -> None:
        self._values: deque[float] = deque(maxlen=RECENT_TIMES)
        self._median: float | None = None

    def add(self, value: float) -> None:
        self._values.append(value)
        self._median = None

    @property
    def count(self) -> int:
        return len(self._values)

    @property
    def median(self) -> float | None:
        if self._median is None and self._values:
            self._median = statistics.median(self._values)
        return self._median


@dataclass
class DraftPolicy:
    """How many drafted tokens are worth checking, learned over the engine's turns."""

    ngram: list[Acceptance] = field(default_factory=lambda: [Acceptance.prior(p) for p in _NGRAM_PRIORS])
    ngram_history: list[Acceptance] = field(
        default_factory=lambda: [Acceptance.prior(p) for p in _HISTORY_PRIORS])
    streak: Acceptance = field(default_factory=lambda: Acceptance.prior(_STREAK_PRIOR))
    resume: Acceptance = field(default_factory=lambda: Acceptance.prior(_RESUME_PRIOR))
    model: Acceptance = field(default_factory=lambda: Acceptance.prior(0.6))
    single_ms: RecentTimes = field(default_factory=RecentTimes)  # one plain decode
    check_ms: dict[int, RecentTimes] = field(default_factory=dict)  # checks, per drafted count
    draft_ms: RecentTimes = field(default_factory=RecentTimes)  # each draft model token
    draft_cost_prior: float = 0.1  # draft token / plain decode, before it is timed
    skipped: dict[int, int] = field(default_factory=dict)  # chances not taken, per rate (its id)
    _costs: list[float] | None = None  # check_cost for 0..MAX_LENGTH, until the next timing

    def decoded(self, n_tokens: int, ms: float) -> None:
        """A decode of ``n_tokens`` (1: plain; more: a check) took ``ms``."""
        if n_tokens == 1:
            self.single_ms.add(ms)
        else:
            self.check_ms.setdefault(n_tokens - 1, RecentTimes()).add(ms)
        self._costs = None

    def drafted(self, n_tokens: int, ms: float) -> None:
        if n_tokens:
            self.draft_ms.add(ms / n_tokens)

    def check_cost(self, drafted: int) -> float:
        """What checking ``drafted`` tokens costs beyond the plain decode it replaces, in plain
        decodes: this machine's own median for checks of that size once it has a few, else
        the prior curve scaled by how this machine's checks compare with it."""
        if self._costs is None:
            self._costs = self._cost_table()
        if drafted < len(self._costs):
            return self._costs[drafted]
        return self._costs[-1] * prior_check_cost(drafted) / prior_check_cost(MAX_LENGTH)

    def _cost_table(self) -> list[float]:
        sizes = range(MAX_LENGTH + 1)
        single = self.single_ms.median
        timed = {d: (times.count, max(0.005 * d, times.median / single - 1.0))
                 for d, times in self.check_ms.items() if single and times.median is not None}
        # The prior curve scaled by all the checks timed so far, each size weighted by how
        # often it was timed (one size timed a few times in a busy moment does not decide).
        n_timed = sum(count for count, _ in timed.values())
        scale = 1.0
        if n_timed >= MEASURED_AFTER:
            scale = (sum(count * cost for count, cost in timed.values())
                     / sum(count * prior_check_cost(d) for d, (count, _) in timed.items()))
            scale = min(2.0, max(0.005, scale))
        return [0.0] + [timed[d][1] if d in timed and timed[d][0] >= OWN_AFTER
                        else max(0.005 * d, scale * prior_check_cost(d)) for d in sizes[1:]]

    @property
    def draft_cost(self) -> float:
        """One token from the draft model, in plain decodes of the target."""
        single, draft = self.single_ms.median, self.draft_ms.median
        if single and draft is not None:
            return min(2.0, max(0.005, draft / single))
        return self.draft_cost_prior

    def ngram_rate(self, match: int, state: CopyState | None, history: bool = False) -> Acceptance:
        """What predicts a prompt-lookup draft: the streak's rate right after a draft accepted
        whole, the resumed copy's after an edit (``state``), else that of matches reaching
        ``match`` tokens back into the conversation before the reply (``history``) or into
        the reply itself."""
        if state == "streak":
            return self.streak
        if state == "resume":
            return self.resume
        return (self.ngram_history if history else self.ngram)[_ngram_bucket(match)]

    def ngram_length(self, match: int, limit: int, state: CopyState | None = None,
                     history: bool = False) -> int:
        """Prompt-lookup tokens worth checking, for a match reaching ``match`` tokens back."""
        rate = self.ngram_rate(match, state, history)
        length = best_length(rate.rate, limit, self.check_cost)
        if state == "streak":
            # Right after a draft accepted whole, the turn's doubling length decides how far
            # (``limit``): a rate learned from short drafts would keep the next one short.
            return limit if length else 0
        if state:
            return length
        return self._or_explore(rate, length, limit)

    def model_length(self, limit: int) -> int:
        """Draft-model tokens worth asking for and checking."""
        draft_cost = self.draft_cost
        length = best_length(self.model.rate, limit, lambda k: self.check_cost(k) + draft_cost * k)
        return self._or_explore(self.model, length, limit)

    def _or_explore(self, rate: Acceptance, length: int, limit: int) -> int:
        """``length``, or when the policy said none for ``rate``'s drafts for the
        EXPLORE_EVERY-th time, a short try."""
        if length:
            return length
        key = id(rate)  # each rate is one object for the policy's life
        self.skipped[key] = self.skipped.get(key, 0) + 1
        if self.skipped[key] % EXPLORE_EVERY:
            return 0
        return min(EXPLORE_LENGTH, limit)


def prior_check_cost(drafted: int) -> float:
    """``PRIOR_CHECK_COST`` at ``drafted`` tokens, linear between its points and beyond."""
    if drafted <= 0:
        return 0.0
    points = PRIOR_CHECK_COST
    for (d0, c0), (d1, c1) in zip(points, points[1:]):
        if drafted <= d1:
            return c0 + (c1 - c0) * (drafted - d0) / (d1 - d0)
    (d0, c0), (d1, c1) = points[-2], points[-1]
    return c1 + (c1 - c0) * (drafted - d1) / (d1 - d0)


def best_length(rate: float, limit: int, cost: Callable[[int], float]) -> int:
    """The draft length (0..limit) with the most tokens per unit of time, when each drafted token
    is accepted with ``rate`` once the ones before it were and a check of k costs ``cost(k)``
    plain decodes beyond one; 0 (no draft) unless that beats plain decoding by MIN_GAIN."""
    best, best_gain = 0, MIN_GAIN
    expected, p = 1.0, 1.0  # tokens a check yields: the sampled one plus the accepted drafts
    for k in range(1, limit + 1):
        p *= rate
        expected += p
        gain = expected / (1.0 + cost(k))
        if gain > best_gain:
            best, best_gain = k, gain
    return best


def reproducible_with_drafts(sampling: Sampling) -> bool:
    """Whether a reply sampled so stays what it would be without drafts. A fixed seed at a
    temperature asks for the same reply every time; but a check's logits are not bit for bit a
    single decode's on every backend (on the CPU: other kernels for one query token than for
    several, up to ~1 logit apart for the test model), and one draw that lands differently changes
    the rest of the reply. The draw sequence itself is the same (one per position, in order), so
    greedy replies differ only after a near-tie, and random-seeded ones are as random as before;
    seeded ones are not drafted."""
    return sampling.greedy or sampling.seed < 0


class Speculator:
    """The engine's drafting for one loaded model: its mode, its drafters, and the policy it
    learns across turns (engine thread only)."""

    def __init__(self, mode: Speculative, off_reason: str | None = None,
                 draft: DraftModel | None = None, is_end: Callable[[int], bool] | None = None,
                 draft_cost: float | None = None, exact_checks: bool = False) -> None:
        self.mode: Speculative = mode
        self.off_reason = off_reason  # the memory kind's, if it cannot speculate at all
        self.draft = draft
        self.is_end = is_end
        self.policy = DraftPolicy()
        self.exact_checks = exact_checks  # a check's logits are a single decode's, bit for bit
        if draft_cost is not None:
            self.policy.draft_cost_prior = draft_cost

    def describe(self) -> str:
        """What drafts, in a few words ("ngram + draft smollm2-135m", "off: ...")."""
        if self.off_reason and self.mode != "off":
            return "off: " + self.off_reason.removeprefix("speculative decoding is off: ")
        parts = []
        if self.mode in ("auto", "ngram"):
            parts.append("ngram")
        if self.mode in ("auto", "draft") and self.draft is not None:
            parts.append(f"draft {self.draft.name}")
        return " + ".join(parts) or "off"

    def for_turn(self, sampling: Sampling) -> TurnDrafts | None:
        """The drafting of one reply with ``sampling``, or None when nothing drafts."""
        if self.mode == "off" or self.off_reason:
            return None
        if not (self.exact_checks or reproducible_with_drafts(sampling)):
            return None
        ngram = self.mode in ("auto", "ngram")
        model = self.draft if self.mode in ("auto", "draft") else None
        if not ngram and model is None:
            return None
        return TurnDrafts(self.policy, ngram, model, gated=self.mode != "draft", is_end=self.is_end)

    def request_abort(self) -> None:
        if self.draft is not None:
            self.draft.runtime.request_abort()

    def clear_abort(self) -> None:
        if self.draft is not None:
            self.draft.runtime.clear_abort()

    def close(self) -> None:
        if self.draft is not None:
            self.draft.close()
            self.draft = None


class TurnDrafts:
    """One reply's drafting: proposes drafts, hears how each went (``verify.ReplySteps``), and
    counts what the turn's timings report (``draft_n``, ``draft_n_accepted``)."""

    def __init__(self, policy: DraftPolicy, ngram: bool, model: DraftModel | None, *,
                 gated: bool = True, is_end: Callable[[int], bool] | None = None) -> None:
        self.policy = policy
        self._ngram = ngram
        self._model = model
        self._gated = gated
        self._is_end = is_end
        self.length = START_LENGTH
        self.draft_n = 0
        self.draft_n_accepted = 0
        self._source: Acceptance | None = None  # what made the draft being checked
        self._streak = False  # the last draft was accepted whole
        self._draft_from: int | None = None  # where in the log the draft being checked was copied from
        self._copied_to: int | None = None  # where the last accepted lookup draft's source went on

    def propose(self, log: TokenLog, room: int, should_stop: Callable[[], bool]) -> list[int]:
        """The tokens to check after ``log`` (at most ``room``; empty: decode plainly)."""
        limit = min(room, self.length)
        if limit <= 0:
            return []
        self._source = None
        draft: list[int] = []
        if self._ngram:
            match = lookup(log.tokens, min(room, MAX_LENGTH), self._is_end)
            if match is not None:
                # A match reaching far back is a passage being copied: draft as far as it
                # reaches at once, not only as far as this turn's hits have doubled the length.
                reach = min(len(match.draft), max(limit, match.length))
                history = match.start < log.history_n
                # The copy states in order, then the match on its own: a state whose rate says
                # no draft leaves the decision to the next (a streak that stops drafting must
                # not stop it for the rest of the turn).
                states: list[tuple[CopyState | None, int]] = []
                if self._streak:
                    states.append(("streak", reach))
                if self._copied_to is not None and 0 <= match.start - self._copied_to <= RESUME_GAP:
                    states.append(("resume", min(len(match.draft), MAX_LENGTH)))
                states.append((None, reach))
                for state, state_reach in states:
                    n = self.policy.ngram_length(match.length, state_reach, state, history)
                    if n:
                        draft = match.draft[:n]
                        self._source = self.policy.ngram_rate(match.length, state, history)
                        self._draft_from = match.start
                        break
        self._streak = False  # a streak is the chance right after a draft accepted whole
        if not draft and self._model is not None:
            n = self.policy.model_length(limit) if self._gated else limit
            if n:
                draft, ms = self._model.propose(log, n, should_stop)
                self.policy.drafted(len(draft), ms)
                self._source = self.policy.model if draft else None
                if not draft and not should_stop():  # asked and had no sure guess: a cost
                    self.policy.model.record(1, 0)
        self.draft_n += len(draft)
        return draft

    def accepted(self) -> None:
        """One drafted token was what the target sampled."""
        self.draft_n_accepted += 1

    def checked(self, drafted: int, accepted: int) -> None:
        """A draft of ``drafted`` tokens was checked to its end: ``accepted`` were kept."""
        if self._source is not None:
            self._source.record(drafted, accepted)
        if self._draft_from is not None and accepted:
            self._copied_to = self._draft_from + accepted
        self._draft_from = None
        self._streak = accepted == drafted
        self.length = min(MAX_LENGTH, 2 * self.length) if accepted == drafted else max(1, accepted + 1)

    def decoded(self, n_tokens: int, ms: float) -> None:
        self.policy.decoded(n_tokens, ms)
