"""Which tokens a new turn must prefill, given what the KV cache already holds.

The engine keeps one record per message in the KV cache: the exact text of the rendered prompt
that message covers and the exact tokens evaluated for it (for a reply: the tokens the model
sampled, not a re-tokenization of its text, which is why llama-cpp-python's own prompt cache
misses, upstream #1369). A new turn renders the whole conversation once, checks that every cached
message's text still sits where the cache says it does, and tokenizes only the pieces that are new:
the end-of-turn marker after the last reply, the new user message, the assistant header.

Three outcomes:
- append: the cache is a prefix of the new prompt (every normal turn);
- shift: whole user/assistant messages were dropped from the middle (context trimming); the kept
  messages stay in the KV cache and only their positions move (``llama_memory_seq_rm`` +
  ``llama_memory_seq_add``). This is the one approximation the engine makes (the moved cells still
  attended to what was removed), so the engine only lets the same conversation reuse them;
- fallback: the template rewrote earlier text, the system prompt changed, or this is another
  conversation; the prompt is re-tokenized per message and the engine reuses the longest common
  token prefix of cells it knows to be exact.

Nothing is ever inserted before cached cells: a summary or a new system prompt that belongs before
kept turns means prefilling from that point (a K/V cell depends on every token before it).

Everything here is plain logic over strings and token lists: ``render`` and ``tokenize`` are
injected, so it is tested without a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Render = Callable[[list[dict], bool], str]
Tokenize = Callable[[str, bool], list[int]]  # (text, at_start_of_context) -> tokens

@dataclass
class CachedMessage:
    """One message as it sits in the KV cache."""

    role: str
    content: str
    text: str  # the slice of the rendered prompt this message covers (header to end marker)
    tokens: list[int] = field(default_factory=list)
    # The reply being generated or just generated: its end-of-turn marker is not in the cache yet
    # (the model sampled it, but sampled tokens are only evaluated when the next one is needed).
    open: bool = False
    # The first tokens of a message whose prefill was stopped (a draft being typed, a turn
    # stopped during prefill): exact cells, reused by token prefix, never matched as a message.
    partial: bool = False

    def matches(self, message: dict) -> bool:
        return not self.partial and self.role == message["role"] and self.content == message["content"]

    @classmethod
    def partial_of(cls, record: CachedMessage, n_tokens: int) -> CachedMessage:
        """The first ``n_tokens`` of ``record``, whose prefill was stopped there, as a partial
        record (its text is unknown: it cannot match a message, only a token prefix)."""
        return cls(record.role, record.content, "", record.tokens[:n_tokens], partial=True)


def without_partial(cache: list[CachedMessage]) -> list[CachedMessage]:
    """``cache`` less the partial record a stopped prefill may have left at its end: the
    conversation it follows, which a turn lays out over (the engine reuses the partial record's
    cells by token prefix, or a background turn drops them)."""
    return cache[:-1] if cache and cache[-1].partial else cache


@dataclass
class Shift:
    """Drop cached tokens [start, end) and move the later ones down into the gap."""

    start: int
    end: int

    @property
    def delta(self) -> int:
        return self.start - self.end


@dataclass
class Layout:
    """The cache after this turn's prefill: records for every message plus the open reply."""

    messages: list[CachedMessage]
    shift: Shift | None = None
    prefix_fallback: bool = False
    # Every cached message is still in the prompt, in order (some may be trimmed away by
    # ``shift``): the same conversation goes on, so its approximate (shifted) cells may serve it.
    continues: bool = False

    @property
    def tokens(self) -> list[int]:
        return [t for m in self.messages for t in m.tokens]


PROMPT = "prompt"  # the role of a prompt given as tokens (``RawPrompt``): no message has it


@dataclass(frozen=True)
class RawPrompt:
    """A prompt given as tokens, laid as they are: no template, no messages (a completion, a
    fill-in-the-middle prompt). Its cells are reused by token prefix as far as they are exact
    (``ConversationCache.exact_n``), never matched as a message: a prompt that extends the one
    before it (the next keystroke, a completion continued from the tokens it returned) prefills
    only what it adds, and its reply is the reply of a fresh prefill."""

    tokens: tuple[int, ...]
    # Its reply as the model writes it (a completion, code: the indentation it starts with is
    # text); False for a prompt laid through the chat template, whose reply may open with
    # reasoning and is split as a chat's is.
    verbatim: bool = True

    def layout(self) -> Layout:
        """The cache after its prefill: one record for the prompt, then the open reply."""
        return Layout([CachedMessage(PROMPT, "", "", list(self.tokens)),
                       CachedMessage("assistant", "", "", [], open=True)])


@dataclass(frozen=True)
class ChatPrompt:
    """A chat turn's messages as the template renders them (tools, thinking mode: ``ModelPrompts
    .chat_prompt``) and the prompt they render to, up to the reply's header. A cached record is
    this turn's only where its text is the prompt's at its place: the same message rendered with
    other tools or another system prompt is other tokens."""

    messages: Sequence[dict]
    text: str
    render: Render | None = None  # what rendered them (None: a prompt only weighed, never laid out)

    def layout_over(self, cache: list[CachedMessage], tokenize: Tokenize,
                    allow_shift: bool = True) -> Layout:
        """``plan_layout`` of these messages over ``cache`` (rendered once, here)."""
        if self.render is None:
            raise ValueError("a prompt made without its renderer cannot be laid out")
        return plan_layout(cache, list(self.messages), self.render, tokenize, allow_shift,
                           prompt=self.text)


class _Mismatch(Exception):
    """The rendered prompt does not agree with the cache; take the fallback path."""


def plan_layout(
    cache: list[CachedMessage],
    messages: list[dict],
    render: Render,
    tokenize: Tokenize,
    allow_shift: bool = True,
    add_generation_prompt: bool = True,
    prompt: str | None = None,
) -> Layout:
    """Lay out ``messages`` over what ``cache`` holds, followed by the assistant header (an open
    record for the reply) unless ``add_generation_prompt`` is False (preparing the cache ahead of
    a turn). ``prompt``: their render, when the caller has it already."""
    if prompt is None:
        prompt = render(messages, add_generation_prompt)
    boundary = _Boundaries(messages, render, prompt)
    cache = without_partial(cache)  # the conversation a stopped prefill's cells follow goes on
    sources, shift = _match(cache, messages, allow_shift)
    continues = shift is not None or (
        len(messages) >= len(cache) and all(s is not None for s in sources[:len(cache)]))
    try:
        records = _walk(prompt, messages, sources, boundary, tokenize)
    except _Mismatch:
        records = _walk(prompt, messages, _aligned_sources(cache, messages), boundary, tokenize,
                        reuse_exact_text_only=True)
        if not add_generation_prompt:
            records.pop()
        return Layout(records, None, prefix_fallback=True)
    if not add_generation_prompt:
        records.pop()  # the empty header record: there is no reply to come
    return Layout(records, shift, continues=continues)


def _match(
    cache: list[CachedMessage], messages: list[dict], allow_shift: bool
) -> tuple[list[CachedMessage | None], Shift | None]:
    """Map each message to its cached record (None = new) and find a trim to apply by shifting:
    whole user/assistant messages dropped, the rest of the cache following on directly."""
    common = 0
    while common < min(len(cache), len(messages)) and cache[common].matches(messages[common]):
        common += 1
    unmatched = list(cache[:common]) + [None] * (len(messages) - common)
    if common == len(cache) or not allow_shift:
        return unmatched, None
    for j in range(common + 1, len(cache)):
        if any(m.role not in ("user", "assistant") for m in cache[common:j]):
            break  # only whole turns are trimmed; a changed system prompt is re-prefilled
        tail = cache[j:]
        if len(messages) - common >= len(tail) and all(
                c.matches(m) for c, m in zip(tail, messages[common:common + len(tail)])):
            sources: list[CachedMessage | None] = [*cache[:common], *tail]
            sources += [None] * (len(messages) - len(sources))
            start = sum(len(m.tokens) for m in cache[:common])
            end = start + sum(len(m.tokens) for m in cache[common:j])
            return sources, Shift(start, end)
    return unmatched, None


def _aligned_sources(cache: list[CachedMessage], messages: list[dict]) -> list[CachedMessage | None]:
    sources: list[CachedMessage | None] = []
    for i, message in enumerate(messages):
        sources.append(cache[i] if i < len(cache) and cache[i].matches(message) else None)
    return sources


class _Boundaries:
    """Character offsets in the full prompt where message i starts, from prefix renders (memoized)."""

    def __init__(self, messages: list[dict], render: Render, prompt: str) -> None:
        self._messages = messages
        self._render = render
        self._prompt = prompt
        self._known: dict[int, int] = {}

    def __call__(self, i: int) -> int:
        if i not in self._known:
            if i == 0:
                self._known[i] = 0
            else:
                try:
                    text = self._render(self._messages[:i], False)
                except Exception:
                    raise _Mismatch from None
                if not self._prompt.startswith(text):
                    raise _Mismatch  # the template is not prefix-stable for this conversation
                self._known[i] = len(text)
        return self._known[i]


def _walk(
    prompt: str,
    messages: list[dict],
    sources: list[CachedMessage | None],
    boundary: _Boundaries,
    tokenize: Tokenize,
    reuse_exact_text_only: bool = False,
) -> list[CachedMessage]:
    records: list[CachedMessage] = []
    pos = 0
    for i, (message, cached) in enumerate(zip(messages, sources)):
        if cached is not None and not cached.open:
            if not prompt.startswith(cached.text, pos):
                if reuse_exact_text_only:
                    cached = None
                else:
                    raise _Mismatch
            else:
                records.append(cached)
                pos += len(cached.text)
                continue
        end = _safe_boundary(boundary, i + 1, pos, reuse_exact_text_only, len(prompt))
        if cached is not None and reuse_exact_text_only and (
            not prompt.startswith(cached.text, pos) or end < pos + len(cached.text)
        ):
            cached = None
        if cached is not None and cached.open:
            # The last reply: keep its sampled tokens, add only its end-of-turn marker.
            if not prompt.startswith(cached.text, pos) or end < pos + len(cached.text):
                raise _Mismatch
            tail = prompt[pos + len(cached.text):end]
            tokens = cached.tokens + (tokenize(tail, False) if tail else [])
            records.append(CachedMessage(cached.role, cached.content, prompt[pos:end], tokens))
        else:
            piece = prompt[pos:end]
            records.append(CachedMessage(message["role"], message["content"], piece,
                                         tokenize(piece, pos == 0) if piece else []))
        pos = end
    header = prompt[pos:]
    records.append(CachedMessage("assistant", "", header, tokenize(header, pos == 0) if header else [],
                                 open=True))
    return records


def _safe_boundary(boundary: _Boundaries, i: int, pos: int, lenient: bool, prompt_len: int) -> int:
    """Boundary i; in the fallback walk an unknown boundary folds the message into the next piece."""
    try:
        end = boundary(i)
    except _Mismatch:
        if not lenient:
            raise
        return pos
    if end < pos:
        if not lenient:
            raise _Mismatch
        return pos
    return min(end, prompt_len)
