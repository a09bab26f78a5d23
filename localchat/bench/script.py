"""The conversation a bench replays: the built-in script (ten ~60-token questions about a
balcony garden, cycled with a round marker for longer runs) or a JSONL file, and ``run_turn``,
which drains one turn the way every bench mode reads it."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from localchat.errors import UserError
from localchat.events import Done, Event, Failed, Token

DEFAULT_SYSTEM = "You are a concise, helpful assistant."
# Questions of ~50-70 tokens each: with 48-token replies a turn adds ~120 tokens to the context.
DEFAULT_QUESTIONS = [
    "I am planning a small vegetable garden on a sunny balcony in a city apartment. Which three "
    "vegetables are easiest for a beginner to grow in pots, and how often should I water them?",
    "Thanks. The balcony faces south and gets very hot in July and August. What can I do to keep "
    "the soil from drying out completely while I am away at work during the day?",
    "Good ideas. Should I use potting mix from a store, or can I mix my own soil with compost "
    "from the kitchen scraps I have been collecting in a bin under the sink?",
    "I have read that tomatoes need support as they grow taller. What kind of support works on a "
    "balcony where I cannot drive stakes into the ground, and when should I add it?",
    "Some leaves on my basil are turning yellow at the bottom of the plant. Is that caused by "
    "too much water, too little water, or something missing from the soil?",
    "What is a simple weekly routine I could follow on Sunday mornings to keep all of these "
    "plants healthy without spending more than twenty minutes on it?",
    "My neighbour suggested companion planting. Which of the vegetables we discussed grow well "
    "together in the same large container, and which ones should be kept apart?",
    "When autumn comes and the nights get cold, which plants can stay outside, which should come "
    "indoors, and what should I do with the soil in the empty pots over winter?",
    "Could you suggest a couple of herbs that would grow well indoors on a kitchen windowsill "
    "during the winter months, and tell me how much light they really need?",
    "Finally, please summarise the most important three pieces of advice from our whole "
    "conversation in a short list that I can print and stick on my fridge.",
]


def load_script(path: Path | None, turns: int | None) -> tuple[str, list[str]]:
    """(system prompt, user messages) from a JSONL script, or the built-in one (cycled to ``turns``)."""
    if path is None:
        questions = DEFAULT_QUESTIONS
        count = turns or len(questions)
        users = [_variant(questions[i % len(questions)], i // len(questions)) for i in range(count)]
        return DEFAULT_SYSTEM, users
    system, users = "", []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UserError(f"cannot read bench script {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            role, content = item["role"], item["content"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{path}:{number}: expected {{\"role\": ..., \"content\": ...}}") from None
        if role == "system":
            system = content
        elif role == "user":
            users.append(content)
        else:
            raise UserError(f"{path}:{number}: role must be system or user, not {role!r}")
    if not users:
        raise UserError(f"{path} has no user messages")
    return system, users[:turns] if turns else users


def read_rows(path: Path, what: str, fields: tuple[str, ...]) -> list[tuple[int, dict]]:
    """(line number, object) for each non-empty line of the JSONL file ``path`` (a prompt or
    schema set: ``what``), each an object with ``fields``; one-line UserErrors otherwise."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UserError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or any(field not in row for field in fields):
                raise ValueError
        except ValueError:
            shape = ", ".join(f'"{field}": ...' for field in fields)
            raise UserError(f"{path}:{number}: expected {{{shape}}}") from None
        rows.append((number, row))
    if not rows:
        raise UserError(f"{path} holds no {what.split()[-1]}s")
    return rows


def _variant(question: str, round_: int) -> str:
    return question if round_ == 0 else f"(Round {round_ + 1}) {question}"


def run_turn(handle: Iterable[Event]) -> tuple[Done, list[int]]:
    """Drain a turn; (final event, the reply's token ids) — raises on Failed."""
    final: Done | Failed | None = None
    tokens: list[int] = []
    for event in handle:
        if isinstance(event, Token):
            tokens.append(event.token_id)
        elif isinstance(event, (Done, Failed)):
            final = event
    if isinstance(final, Failed):
        raise UserError(f"turn failed: {final.message}")
    if final is None:
        raise UserError("the turn ended without a final event")
    return final, tokens
