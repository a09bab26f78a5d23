"""A chat request as the engine takes it, whichever API it came through (:class:`ChatRequest`),
and the one table of sampling values both APIs read (:data:`SAMPLING_FIELDS`): OpenAI's at the
top level of the body, Ollama's under ``options``, with the same names and ranges.

The messages are the app's own ``{"role", "content"}`` dicts (``request_messages``), laid out by the
engine exactly as the app lays them out; nothing in a request can name a file. A completion has
no messages but a ``prompt`` (:class:`PromptRecipe`, ``prompt_tokens``): tokens made with the
loaded model's vocabulary when its turn comes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from localchat.engine.options import Sampling, shaped
from localchat.formats import AnswerFormat
from localchat.serve.fields import integer, number

if TYPE_CHECKING:
    from localchat.engine.engine import Engine
    from localchat.engine.layout import RawPrompt


class PromptRecipe(Protocol):
    """How a completion's prompt becomes tokens (``prompt_tokens``)."""

    def build(self, engine: Engine, model: str) -> RawPrompt:
        """The tokens, with ``engine``'s vocabulary (the loaded ``model``); BadRequest naming
        the field when the model cannot take them."""
        ...


@dataclass(frozen=True)
class SamplingField:
    """A sampling value both APIs take under this name (``engine.options.Sampling``'s too),
    checked against its range (``high`` None: no upper bound)."""

    name: str
    kind: type[int] | type[float]
    low: float
    high: float | None = None

    def read(self, obj: dict[str, Any], where: str = "") -> int | float | None:
        if self.kind is int:
            high = None if self.high is None else int(self.high)
            return integer(obj, self.name, int(self.low), where, high=high)
        assert self.high is not None
        return number(obj, self.name, self.low, self.high, where)


SAMPLING_FIELDS = (
    SamplingField("temperature", float, 0, 2),
    SamplingField("top_p", float, 0, 1),
    SamplingField("top_k", int, 0),
    SamplingField("min_p", float, 0, 1),
    SamplingField("repeat_penalty", float, 0.01, 10),
    SamplingField("frequency_penalty", float, -2, 2),
    SamplingField("presence_penalty", float, -2, 2),
    SamplingField("seed", int, -(2**63), 2**63 - 1),
)


def read_sampling(obj: dict[str, Any], where: str, max_tokens: int | None) -> dict[str, Any]:
    """The request's ``max_tokens`` (each API names it its own way) and :data:`SAMPLING_FIELDS`
    as read from ``obj`` (None: not given), checked in the table's order."""
    return {"max_tokens": max_tokens, **{f.name: f.read(obj, where) for f in SAMPLING_FIELDS}}


@dataclass(frozen=True)
class ChatRequest:
    """What to answer and how. Sampling values the request did not give (None) take the
    server's defaults."""

    model: str | None
    messages: list[dict[str, Any]]
    stream: bool
    sampling: Mapping[str, Any] = field(default_factory=dict)  # read_sampling's
    stop: list[str] = field(default_factory=list)
    thinking: str | None = None  # "on" | "off": the template's thinking switch
    include_usage: bool = False  # OpenAI stream_options.include_usage
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI function specs the model may call
    tool_choice: str = "auto"  # "auto" | "none" | "required" | a tool's name
    answer_format: AnswerFormat | None = None  # response_format / Ollama's format
    prompt: PromptRecipe | None = None  # a completion's (``messages`` is then empty)
    logprobs: int | None = None  # alternatives per token with its log probability (None: off)

    def sampling_over(self, defaults: Sampling) -> Sampling:
        """``defaults`` with what this request asked for."""
        given = {**self.sampling, "thinking": self.thinking}
        sampling = replace(defaults, **{k: v for k, v in given.items() if v is not None})
        return replace(shaped(sampling, self.answer_format), tools=self.tools,
                       tool_choice=self.tool_choice, logprobs=self.logprobs)
