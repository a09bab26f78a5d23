"""Reasoning ("thinking") in a streamed reply: telling it apart from the answer.

Reasoning models write their chain of thought before the answer, as ``<think>…</think>`` in the
reply text (Qwen3, DeepSeek-R1 distills, Phi-4 reasoning), or with the ``<think>`` already written
by the chat template at the end of the prompt (Qwen3-Thinking-2507, the R1 distills' newer
templates), so that the reply starts inside the block. Remote servers that split reasoning out
themselves send it as ``reasoning_content`` deltas; those that do not send the tags inline.

:class:`ReasoningSplitter` is the one parser, used for the local stream and for remote ``content``:
feed it each piece of text as it arrives and it returns what is reasoning and what is answer,
holding back only the few characters that may be the start of a tag. The raw reply (tags and all)
is what goes into the conversation history: the model's own template decides what earlier turns'
reasoning looks like in the context (Qwen3's drops it), and the saved session keeps it.
"""

from __future__ import annotations

from typing import Literal

OPEN = "<think>"
CLOSE = "</think>"

Phase = Literal["start", "thinking", "answer"]


class ReasoningSplitter:
    """Splits one reply, piece by piece, into reasoning and answer text.

    ``inside=True`` when the prompt already opened the block (see :func:`prompt_opens_thinking`).
    Otherwise a block counts only when ``<think>`` is the first thing in the reply: an answer that
    mentions the tag later is left alone. Whitespace right after ``<think>`` and ``</think>`` and
    at the start of the answer is dropped (it separates the parts; it is not content).
    """

    def __init__(self, inside: bool = False) -> None:
        self.phase: Phase = "thinking" if inside else "start"
        self._pending = ""  # text not yet released: maybe the start of a tag
        self._trim_next = inside  # drop the whitespace that follows an opening or closing tag

    def __repr__(self) -> str:
        return f"<ReasoningSplitter {self.phase} pending={self._pending!r}>"

    @property
    def thinking(self) -> bool:
        return self.phase == "thinking"

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, answer) released by this piece; either may be empty."""
        if self.phase == "answer" and not self._trim_next and not self._pending:
            return "", text  # the answer has begun and nothing is held back: once per token
        self._pending += text
        thinking, answer = [], []
        while True:
            if self.phase == "start":
                stripped = self._pending.lstrip()
                if stripped.startswith(OPEN):
                    self.phase, self._trim_next = "thinking", True
                    self._pending = stripped[len(OPEN):]
                    continue
                if OPEN.startswith(stripped):
                    break  # nothing yet, or a prefix of "<think>": wait for more
                self.phase, self._trim_next = "answer", True
                continue
            if self._trim_next:
                self._pending = self._pending.lstrip()
                if not self._pending:
                    break
                self._trim_next = False
            if self.phase == "answer":
                answer.append(self._pending)
                self._pending = ""
                break
            end = self._pending.find(CLOSE)
            if end >= 0:
                thinking.append(self._pending[:end])
                self._pending = self._pending[end + len(CLOSE):]
                self.phase, self._trim_next = "answer", True
                continue
            keep = _partial_suffix(self._pending, CLOSE)
            thinking.append(self._pending[:len(self._pending) - keep])
            self._pending = self._pending[len(self._pending) - keep:]
            break
        return "".join(thinking), "".join(answer)

    def flush(self) -> tuple[str, str]:
        """What is still held back, at the end of the reply."""
        pending, self._pending = self._pending, ""
        if self.phase == "thinking":
            return pending, ""
        return "", pending


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def prompt_opens_thinking(prompt_tail: str) -> bool:
    """Whether the rendered prompt ends inside an open reasoning block (the template wrote
    ``<think>`` for the model), so the reply starts as reasoning."""
    return prompt_tail.rfind(OPEN) > prompt_tail.rfind(CLOSE)


def split_reply(reply: str) -> tuple[str, str]:
    """(reasoning, answer) of a whole stored reply. A reply holding ``</think>`` without an
    opening tag began inside a block the template opened."""
    stripped = reply.lstrip()
    if not stripped.startswith(OPEN):
        end = reply.find(CLOSE)
        if end < 0 or OPEN in reply[:end]:
            return "", reply
        return reply[:end].strip(), reply[end + len(CLOSE):].lstrip()
    splitter = ReasoningSplitter()
    thinking, answer = splitter.feed(reply)
    more_thinking, more_answer = splitter.flush()
    return (thinking + more_thinking).strip(), answer + more_answer


def join_reply(reasoning: str, answer: str) -> str:
    """The reply as stored in history when reasoning arrived apart (a remote's
    ``reasoning_content``): the tagged form every template and :func:`split_reply` understand."""
    if not reasoning:
        return answer
    return f"{OPEN}\n{reasoning.strip()}\n{CLOSE}\n\n{answer}"


def strip_reasoning(reply: str) -> str:
    """The answer alone: what a remote model is shown of an earlier reply."""
    return split_reply(reply)[1]
