"""Slash commands: what the user can type after ``/``, with the help text shown while typing.

Each command is a small record; ``localchat.tui.commands`` pairs each with its handler, and the
app runs ``/NAME ARG`` as ``handler(ARG)``. The same records feed the autocomplete hints, the
help screen and the command palette, so a command added here shows up everywhere (and one
without a handler fails as the app starts).
"""

from __future__ import annotations

from dataclasses import dataclass

from localchat.errors import UserError


@dataclass(frozen=True)
class SlashCommand:
    name: str
    help: str
    argument: str = ""  # placeholder shown in usage, e.g. "NAME"; "" = takes none
    argument_required: bool = False

    @property
    def usage(self) -> str:
        if not self.argument:
            return f"/{self.name}"
        return f"/{self.name} {self.argument}" if self.argument_required else f"/{self.name} [{self.argument}]"


COMMANDS: tuple[SlashCommand, ...] = (
    SlashCommand("new", "Start a new session"),
    SlashCommand("model", "Switch model (loads in the background)", "NAME", argument_required=True),
    SlashCommand("system", "Set this session's system prompt from the next message on; no text "
                 "shows it, `clear` removes it", "TEXT|clear"),
    SlashCommand("clear", "Forget this session's messages (name and system prompt stay)"),
    SlashCommand("retry", "Ask the last question again"),
    SlashCommand("copy", "Copy the last reply, or its last code block with /copy code", "code"),
    SlashCommand("sessions", "Show or hide the sessions sidebar"),
    SlashCommand("file", "Attach a text file to the next message (also @path in a message; "
                 "`clear` removes them)", "PATH|clear", argument_required=True),
    SlashCommand("search", "Find messages in every session; Enter opens the session", "TEXT",
                 argument_required=True),
    SlashCommand("rename", "Rename this session", "NAME", argument_required=True),
    SlashCommand("export", "Save this session as Markdown, or JSON for a .json PATH (default: a new "
                 ".md file in the current folder)", "PATH"),
    SlashCommand("stats", "TTFT and TPOT of this session's replies as sparklines; p50/p95 per model"),
    SlashCommand("summary", "Show the summary of turns trimmed from the context"),
    SlashCommand("think", "Thinking switch for models that have one: on, off or auto (the model's "
                 "default); no argument shows it", "on|off|auto"),
    SlashCommand("big", "Send this message to the remote large model ([remote] in config.toml)",
                 "TEXT", argument_required=True),
    SlashCommand("help", "Show keys and commands"),
)

_BY_NAME = {command.name: command for command in COMMANDS}


def is_command(text: str) -> bool:
    """True for input meant as a command: ``/word``. ``//text`` sends ``/text`` as a message."""
    return text.startswith("/") and not text.startswith("//")


def message_text(text: str) -> str:
    """The message that input which is not a command sends: ``//text`` sends ``/text``."""
    return text[1:] if text.startswith("//") else text


def parse(text: str) -> tuple[SlashCommand, str]:
    """Split ``/name argument`` into its command and stripped argument.

    Raises ``UserError`` for an unknown command or a missing required argument.
    """
    name, _, argument = text[1:].strip().partition(" ")
    command = _BY_NAME.get(name.lower())
    if command is None:
        close = [c.usage for c in COMMANDS if c.name.startswith(name.lower()[:2])] if name else []
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UserError(f"Unknown command /{name}.{hint} Type /help for the list.")
    argument = argument.strip()
    if command.argument_required and not argument:
        raise UserError(f"Usage: {command.usage} — {command.help}.")
    return command, argument


@dataclass(frozen=True)
class Completion:
    """One autocomplete suggestion: what Tab inserts, and what the hint line shows."""

    text: str
    label: str
    help: str = ""


def completions(text: str, models: list[tuple[str, bool]]) -> list[Completion]:
    """Suggestions for the input ``text``: command names after ``/``, model names after
    ``/model `` (``models``: (name, downloaded); one not downloaded says so)."""
    if not is_command(text) or "\n" in text:
        return []
    head, space, rest = text[1:].partition(" ")
    if not space:
        return [
            Completion(f"/{c.name}" + (" " if c.argument else ""), c.usage, c.help)
            for c in COMMANDS
            if c.name.startswith(head.lower())
        ]
    if head.lower() == "model":
        return [Completion(f"/model {name}", name, "" if downloaded else "not downloaded: `localchat pull " + name + "`")
                for name, downloaded in models if name.startswith(rest.strip())]
    return []
