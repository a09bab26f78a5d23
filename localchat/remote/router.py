"""Rules that send a prompt to the remote before any local generation (mode ``auto``).

Two kinds of rule:

- **Fit**: the prompt alone does not fit the room the local context has for it, even after the
  session trimmed the history (the caller says how much room there is).
- **Hard task**: features that predict a task a small model fails at — long multi-part
  instructions, requests for step-by-step reasoning or a worked example, proofs and derivations,
  multi-step word problems, writing or fixing code, legal/medical/financial drafting, long
  structured documents, many constraints, open-ended analysis, and the prompt's length. Each
  feature adds a weight; a total at or above the threshold escalates. The threshold is
  ``RouterThresholds.rule_score`` when the user set it, otherwise a function of the local
  model's parameter count (:func:`rule_score_for`): a 135M model escalates more than an 8B one.

Everything is regular expressions over the prompt text, compiled once: a decision costs well
under a millisecond (``localchat bench --router`` measures it on the labelled sets in data/).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from localchat.remote.context import estimate_tokens
from localchat.settings.remote import RouterThresholds


@dataclass(frozen=True)
class RouteDecision:
    """The rules' verdict. ``reason`` is one line for the status bar and the chat log."""

    escalate: bool
    reason: str
    score: float = 0.0
    features: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Feature:
    name: str  # as the user reads it in route_reason
    pattern: re.Pattern[str]
    weight: float
    # Each further match adds this much more (capped), for features where "how many" matters.
    per_extra: float = 0.0
    cap: float = 0.0


# The labelled calibration set the rules were tuned on (``localchat bench --router`` scores it;
# ``router_holdout.jsonl`` beside it was not used for tuning).
LABELLED_PROMPTS = Path(__file__).parent / "data" / "router_prompts.jsonl"


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE | re.MULTILINE)


_FEATURES: tuple[_Feature, ...] = (
    _Feature("step-by-step reasoning",
             _rx(r"step[- ]by[- ]step|show (?:all )?(?:your|the) (?:work|steps|reasoning|calculations?|"
                 r"arithmetic|math)|walk (?:me )?through|explain(?:ing)? (?:your|the) reasoning|"
                 r"justify (?:each|every|your)|(?:worked|concrete|numerical|numeric) (?:\w+ )?example|"
                 r"on an example|stating each assumption|"
                 r"\bin full\b|\b(?:line|message|stage|phase|clause|term) by (?:line|message|stage|"
                 r"phase|clause|term)\b"), 2.0),
    _Feature("proof or derivation",
             _rx(r"\b(?:prove|proof|derive|derivation|show that|theorem|lemma|closed[- ]form|"
                 r"integral|integrate|differentiate|eigen\w*|asymptotic|big[- ]o|recurrence|"
                 r"induction|expected value|probability that|undecidable)\b"), 2.5),
    _Feature("math notation",
             _rx(r"\\(?:frac|sum|int|sqrt|lim)|[∑∫√≤≥≠∞]|\b[a-z]\^\d|"
                 r"\b\d+\s*[*/^]\s*\d+\s*[*/^+-]"), 1.0),
    _Feature("code to write or fix",
             _rx(r"\b(?:implement|refactor|debug|optimi[sz]e|write (?:a |an |the )?(?:\w+ ){0,3}"
                 r"(?:function|program|script|class|module|query|parser|server|test|algorithm|"
                 r"regex|api)|fix (?:this|the|my) (?:bug|code|function|error|query)|"
                 r"thread[- ]safe|time complexity|unit tests?|include tests|benchmark)\b"), 1.5,
             per_extra=0.5, cap=1.0),
    _Feature("code in the prompt",
             _rx(r"```|^\s*(?:def |class |import |#include|public |fn |func |SELECT )|[;{}]\s*$"), 1.0),
    _Feature("analysis or design",
             _rx(r"\b(?:compare|contrast|analy[sz]e|analysis|evaluate|trade[- ]?offs?|pros and cons|"
                 r"architecture|design (?:a|an|the)|strategy|critique|in depth|comprehensive|"
                 r"detailed plan|migration plan)\b"), 1.0, per_extra=0.5, cap=1.0),
    _Feature("asks for a detailed explanation",
             _rx(r"\b(?:explain (?:in detail|why|how|the (?:causes|difference))|in detail|"
                 r"what are my rights|how .{3,40} affects?|key arguments)\b"), 1.0),
    _Feature("legal, medical or financial",
             _rx(r"\b(?:contract|clause|agreement|liabilit(?:y|ies)|indemnif\w*|warrant(?:y|ies)|"
                 r"terms of service|governing law|dispute resolution|non-disclosure|tenancy|lease|"
                 r"diagnos[ie]s|dosage|prescri(?:bed|ption)|medications?|drug interactions?|interactions|"
                 r"side effects|disease|mortgage|loan|interest rate|annual interest|tax(?:es|ation)?|"
                 r"invest(?:ing|ment)s?|financial plan|revenue forecast|break[- ]even|budget|"
                 r"pension|retirement)\b"), 1.0, per_extra=0.5, cap=1.0),
    _Feature("a document to draft",
             _rx(r"\bdraft\b|\b(?:write|create|prepare|produce) (?:me )?(?:a |an |the |my )?"
                 r"(?:[\w,-]+ ){0,3}(?:report|plan|manual|agreement|contract|clause|policy|proposal|"
                 r"terms|letter|essay|guide|specification|cv|resume|memo|article|white ?paper)s?\b"),
             1.0),
    _Feature("long structured document",
             _rx(r"\b\d[\d,]*[- ]words?\b|\bsections?\b|\bheadings?\b|executive summary|\bchapters?\b|"
                 r"table of contents|checklist|list of (?:sources|references|citations)"), 1.0,
             per_extra=0.5, cap=1.0),
    _Feature("many constraints",
             _rx(r"\b(?:must|should|without|at least|at most|no more than|exactly|ensure|make sure|"
                 r"do not|don't|never|only use|each|every|under \d+|within \d+)\b"), 0.0,
             per_extra=0.5, cap=2.5),
    _Feature("multi-part instructions",
             _rx(r"^\s*(?:\d+[.)]|[-*•]|[a-h][.)])\s+\S|\b(?:first|second|third|then|finally|also|"
                 r"additionally|and then)\b[, ]"), 0.0, per_extra=0.5, cap=2.5),
)

# A word problem: several quantities and a question that needs arithmetic over them. Each
# pattern alone is common in easy prompts ("What is 9 times 7?", "How many legs…"); together
# they mark the multi-step math a small model gets wrong.
_QUANTITY = _rx(r"(?<![\w.])\d+(?:[.,]\d+)*\s*%?")
_COMPUTE = _rx(r"\b(?:solve|calculate|compute|estimate|how (?:long|far|many|much|fast|old)|"
               r"at what time|when (?:is|does|will)|what (?:was|were|is|are) the (?:original|final|total|average)|"
               r"what fraction|find the)\b")
_MATH_PROBLEM, _MATH_WEIGHT, _MIN_QUANTITIES = "multi-step math", 2.0, 3

# Word counts at which a prompt's length alone starts to count.
_MEDIUM_WORDS, _LONG_WORDS, _VERY_LONG_WORDS = 20, 80, 200
_SHORT_WORDS = 10

# The local model's size moves the threshold: a 135M model fails at tasks an 8B one handles.
# rule_score = _SIZE_BASE + _SIZE_SLOPE * log10(params / _SIZE_REFERENCE), clamped: 1.75 for
# SmolLM2-135M (where the labelled sets were calibrated), ~2.45 at 1B, ~3.2 at 8B, 3.5 at 70B.
_SIZE_REFERENCE, _SIZE_BASE, _SIZE_SLOPE = 135e6, 1.75, 0.8
_SIZE_MIN, _SIZE_MAX = 1.5, 3.5
# Unknown size (no model file at hand): the threshold this project shipped before it scaled.
_UNKNOWN_SIZE_SCORE = 2.0


def rule_score_for(thresholds: RouterThresholds, n_params: int | None) -> float:
    """The score at or above which a prompt escalates: the user's ``rule_score`` when set,
    otherwise a function of the local model's parameter count (None: unknown)."""
    if thresholds.rule_score is not None:
        return thresholds.rule_score
    if not n_params:
        return _UNKNOWN_SIZE_SCORE
    score = _SIZE_BASE + _SIZE_SLOPE * math.log10(n_params / _SIZE_REFERENCE)
    return round(min(_SIZE_MAX, max(_SIZE_MIN, score)), 2)


def decide(
    prompt: str,
    thresholds: RouterThresholds | None = None,
    *,
    local_room_tokens: int | None = None,
    prompt_tokens: int | None = None,
    local_params: int | None = None,
) -> RouteDecision:
    """Should ``prompt`` go to the remote before the local model tries?

    ``local_room_tokens``: how many prompt tokens the local context can take for this turn after
    trimming (context size minus system prompt, summary and reply reserve); None skips the fit
    rule. ``prompt_tokens``: the prompt's size from the local tokenizer, if the caller has it
    (otherwise estimated from characters). ``local_params``: the local model's parameter count,
    which sets the threshold unless the user fixed ``rule_score`` (see :func:`rule_score_for`).
    """
    thresholds = thresholds or RouterThresholds()
    if local_room_tokens is not None:
        size = prompt_tokens if prompt_tokens is not None else estimate_tokens(prompt)
        if size > local_room_tokens * thresholds.local_fit_fraction:
            return RouteDecision(True, f"prompt (~{size} tokens) does not fit the local context "
                                       f"({local_room_tokens} tokens free)", float("inf"), ("fit",))
    threshold = rule_score_for(thresholds, local_params)
    score, features = _score(prompt)
    escalate = score >= threshold
    named = ", ".join(features) if features else "no hard-task features"
    relation = ">=" if escalate else "<"
    return RouteDecision(escalate, f"{named} (score {score:g} {relation} {threshold:g})",
                         score, features)


def _score(prompt: str) -> tuple[float, tuple[str, ...]]:
    total, named = 0.0, []
    for feature in _FEATURES:
        hits = len(feature.pattern.findall(prompt))
        if not hits:
            continue
        extra = min(feature.cap, feature.per_extra * (hits - 1)) if feature.per_extra else 0.0
        points = feature.weight + extra
        if points > 0:
            total += points
            named.append(feature.name)
    if len(_QUANTITY.findall(prompt)) >= _MIN_QUANTITIES and _COMPUTE.search(prompt):
        total += _MATH_WEIGHT
        named.append(_MATH_PROBLEM)
    words = len(prompt.split())
    if words >= _VERY_LONG_WORDS:
        total += 2.0
        named.append("very long prompt")
    elif words >= _LONG_WORDS:
        total += 1.0
        named.append("long prompt")
    elif words >= _MEDIUM_WORDS:
        total += 0.5  # not a feature of its own: only tips a prompt that already has one
    elif words < _SHORT_WORDS:
        total -= 0.5  # a short question is rarely a hard task, whatever words it uses
    return round(total, 2), tuple(named)
