"""A grammar the answer must follow while a reply is sampled, and where in the reply it applies.

:class:`Constraint` is what a turn asks of the sampler: GBNF text (``formats.gbnf``, the JSON
Schema converter, ``formats.tool_grammar``), either applied from the answer's first token or lazy,
until a trigger. :class:`AnswerGate` says, token by token, who decides what may come next: the
sampler alone (reasoning, whitespace before the answer, text before a trigger) or the grammar.
Plain logic without a model: the engine's constrained sampling (``engine.sampling.constrained``)
consumes both.

Where the grammar applies: from the answer's first token. A reasoning block (opened by the prompt,
or by a ``<think>`` the reply starts with) is free; the grammar starts after it closes, whitespace
between the two left out. A token that would close the block and begin the answer at once is
refused and drawn again, so that the answer's first token is always one the grammar judged. With
trigger patterns or tokens (lazy, as llama.cpp's ``llama_sampler_init_grammar_lazy_patterns``)
the answer is free until a pattern matches the answer so far (``re.search``) or a trigger token is
sampled; the grammar then applies from the match (from its first non-empty capture group if it
has one), the matched text fed to it first. Unlike llama.cpp, which aborts the process when the
grammar rejects that text, a trigger whose text the grammar refuses leaves the rest of the reply
free (a tool call naming a tool not offered is then read as written, and the model told what is
wrong with it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from localchat.reply.reasoning import CLOSE, OPEN


@dataclass(frozen=True)
class Constraint:
    """A grammar the reply's answer must follow while it is sampled (see the module).

    ``grammar``: GBNF text, its start rule ``root``. Without triggers it applies from the
    answer's first token (after any reasoning). With ``trigger_patterns`` (regular expressions
    searched in the answer so far) or ``trigger_tokens`` (token ids) it is lazy, as llama.cpp's
    ``llama_sampler_init_grammar_lazy_patterns``: the answer is free until one matches, and the
    grammar applies from there (from the pattern's first non-empty capture group if it has one),
    beginning with the matched text; a tool call is ``root ::= "<tool_call>" ...`` with the
    trigger ``<tool_call>``.
    """

    grammar: str
    root: str = "root"
    trigger_patterns: tuple[str, ...] = ()
    trigger_tokens: tuple[int, ...] = ()


class Verdict(Enum):
    FREE = "free"  # reasoning, whitespace before the answer, or before a trigger
    GRAMMAR = "grammar"  # the grammar judges it
    REFUSED = "refused"  # closes the reasoning and starts the answer in one token: redraw


class AnswerGate:
    """Where the grammar applies in one reply, token by token (see the module docstring)."""

    def __init__(self, inside_reasoning: bool, patterns: tuple[re.Pattern[str], ...],
                 trigger_tokens: tuple[int, ...]) -> None:
        self.reasoning = inside_reasoning
        self._at_start = not inside_reasoning
        self._between = False  # the reasoning closed; no answer text yet
        self._patterns = patterns
        self._trigger_tokens = frozenset(trigger_tokens)
        self.triggered = not (patterns or trigger_tokens)
        self._tail = ""  # the end of the reasoning (a closing tag may span tokens)
        self._answer = ""  # the answer while waiting for a trigger

    def give_up(self) -> None:
        """The grammar refused what its trigger matched: the rest of the reply is free."""
        self.triggered = False
        self._patterns, self._trigger_tokens = (), frozenset()

    def judge(self, text: str) -> Verdict:
        """Who decides whether a token with ``text`` may come next."""
        if self.reasoning:
            seen = self._tail + text
            end = seen.find(CLOSE)
            if end < 0 or not seen[end + len(CLOSE):].strip() or not self.triggered:
                return Verdict.FREE
            return Verdict.REFUSED
        if self._at_start and text.lstrip().startswith(OPEN):
            return Verdict.FREE
        if (self._between or self._at_start and not self.triggered) and not text.strip():
            return Verdict.FREE
        return Verdict.GRAMMAR if self.triggered else Verdict.FREE

    def advance(self, token: int, text: str, verdict: Verdict) -> str | None:
        """``token`` with ``text`` came next, as ``verdict`` judged it. The text the grammar
        must take first when this token triggered it (None otherwise)."""
        if self.reasoning:
            seen = self._tail + text
            end = seen.find(CLOSE)
            if end < 0:
                self._tail = seen[-(len(CLOSE) - 1):]
                return None
            self.reasoning, self._between = False, True
            rest = seen[end + len(CLOSE):]  # the answer's start (judged free: before a trigger)
            return self.advance(token, rest, Verdict.FREE) if rest.strip() else None
        if self._at_start and text.lstrip().startswith(OPEN):
            self._at_start, self.reasoning = False, True
            self._tail = text.lstrip()[len(OPEN):][-(len(CLOSE) - 1):]
            return None
        if verdict is Verdict.FREE and not text.strip() and not self._answer:
            return None  # whitespace before the answer: no part of it
        self._at_start = self._between = False
        if self.triggered:
            return None
        self._answer += text
        start = len(self._answer) - len(text) if token in self._trigger_tokens else None
        for pattern in self._patterns if start is None else ():
            found = pattern.search(self._answer)
            if found:
                groups = [i for i in range(1, (found.lastindex or 0) + 1) if found.group(i)]
                start = found.start(groups[0]) if groups else found.start()
                break
        if start is None:
            return None
        self.triggered = True
        return self._answer[start:]
