"""May this call run? The user's answer, kept as they meant it, as plain logic.

Before any call runs the user sees the tool, its server and its arguments and answers:

- ``ONCE`` (y): this call only;
- ``SESSION`` (a): always, for this tool, until localchat exits; for ``run_command`` only for
  the same command string (Ollama's rule for its bash tool: "always" must not cover ``rm``);
- ``SAVE``: always, written to config.toml's ``[tools.always_allow]`` for this server and tool
  (not offered for ``run_command``);
- ``DENY`` (n or Esc): the call never runs and the model is told "denied by the user".

:meth:`ApprovalPolicy.check` answers at once when it can (saved in config.toml, granted this
session, or a ``--allow-tool`` rule), and otherwise returns an :class:`ApprovalRequest`: a
question carrying a ``concurrent.futures.Future`` that travels up to whatever front end asks (a
screen in the TUI, a prompt in ``ask``, a denial without a terminal), as Toad's permission
screen does; :meth:`ApprovalRequest.answer` records the grant and resolves the future. The
question and the :class:`~localchat.events.Decision` are the event vocabulary's
(``localchat.events.ApprovalQuestion``): the front ends read them there.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localchat.errors import UserError
from localchat.events import Decision
from localchat.reply.calls import ToolCall
from localchat.settings.tools import ANY_TOOL, BUILTIN_SERVER, ToolsSettings, save_always_allow
from localchat.terminal import visible
from localchat.tools.catalogue import ToolInfo

log = logging.getLogger("localchat.tools.approval")

PER_COMMAND = ("run_command",)  # built-ins whose "always" covers one exact command string
LINE_CHARS = 200  # of a call's one-line form


def call_line(call: ToolCall, tool: ToolInfo | None = None, limit: int | None = LINE_CHARS) -> str:
    """``server.tool({"arg": ...})`` in one inert line: how a call is shown, cut to ``limit``
    characters (``…)`` says where). A question about it uses the whole line (``limit=None``): a
    command's tail (``; rm …``) must never be hidden from the one who approves it."""
    name = tool.label if tool else call.name
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    line = visible(f"{name}({arguments})", newlines=False)
    return line if limit is None or len(line) <= limit else line[:limit - 2] + "…)"


class AllowRules:
    """``--allow-tool NAME`` rules (repeatable): ``*`` for every tool, ``server.*`` for all of a
    server's, ``server.tool`` for one, or a tool's name on any server."""

    def __init__(self, names: Sequence[str] = ()) -> None:
        for name in names:
            if not name.strip():
                raise UserError("--allow-tool needs a tool name ('*' allows every tool)")
        self.names = tuple(name.strip() for name in names)

    def __repr__(self) -> str:
        return f"AllowRules({list(self.names)!r})"

    def allows(self, tool: ToolInfo) -> bool:
        for rule in self.names:
            if rule == ANY_TOOL or rule in (tool.label, tool.name, tool.exposed):
                return True
            server, _, name = rule.rpartition(".")
            if server == tool.server and name == ANY_TOOL:
                return True
        return False


@dataclass(eq=False)
class ApprovalRequest:
    """One question to the user, a ``localchat.events.ApprovalQuestion``. ``future`` resolves
    to the :class:`Decision`; a front end calls :meth:`answer` (from any thread) and shows what
    it returns."""

    call: ToolCall
    tool: ToolInfo
    per_command: bool = False  # "always" covers only this exact command (``run_command``)
    can_save: bool = True  # "always" may be saved in config.toml
    line: str = field(init=False)  # the whole call in one inert line (call_line)
    future: concurrent.futures.Future[Decision] = field(default_factory=concurrent.futures.Future)
    _record: Callable[[ApprovalRequest, Decision], str] = field(default=lambda r, d: "",
                                                                  repr=False)

    def __post_init__(self) -> None:
        self.line = call_line(self.call, self.tool, limit=None)

    def answer(self, decision: Decision) -> str:
        """Record ``decision`` and resolve the future (a second answer is ignored); returns a
        notice for the user ("" when there is nothing to say)."""
        if self.future.done():
            return ""
        notice = self._record(self, decision)
        self.future.set_result(decision)
        return notice

    def wait(self, timeout: float | None = None) -> Decision:
        return self.future.result(timeout)


class ApprovalPolicy:
    """What the user allowed: saved in config.toml, granted this session, or by rules."""

    def __init__(self, settings: ToolsSettings | None = None, rules: AllowRules | None = None,
                 config_path: Path | None = None) -> None:
        settings = settings or ToolsSettings()
        self.rules = rules or AllowRules()
        self._config_path = config_path
        self._saved = {(server, name) for server, names in settings.always_allow.items()
                       for name in names}
        self._session: set[tuple[str, str]] = set()
        self._commands: set[tuple[str, str, str]] = set()  # (server, tool, exact command)
        self._lock = threading.Lock()

    def allowed(self, call: ToolCall, tool: ToolInfo) -> bool:
        """Whether ``call`` may run without asking."""
        key = (tool.server, tool.name)
        with self._lock:
            if key in self._saved or (tool.server, ANY_TOOL) in self._saved:
                return True
            if key in self._session:
                return True
            if (*key, self._command(call)) in self._commands:
                return True
        return self.rules.allows(tool)

    def check(self, call: ToolCall, tool: ToolInfo) -> ApprovalRequest | None:
        """None when ``call`` may run now; else the question to put to the user."""
        if self.allowed(call, tool):
            return None
        per_command = tool.server == BUILTIN_SERVER and tool.name in PER_COMMAND
        return ApprovalRequest(call, tool, per_command, can_save=not per_command,
                               _record=self._record)

    def _record(self, request: ApprovalRequest, decision: Decision) -> str:
        tool, key = request.tool, (request.tool.server, request.tool.name)
        if decision in (Decision.ONCE, Decision.DENY):
            return ""
        with self._lock:
            if request.per_command:
                self._commands.add((*key, self._command(request.call)))
                return f"{tool.label}: this exact command is allowed until localchat exits"
            self._session.add(key)
        if decision is Decision.SESSION or not request.can_save:
            return f"{tool.label}: allowed until localchat exits"
        try:
            path = save_always_allow(tool.server, tool.name, self._config_path)
        except (UserError, OSError) as exc:
            log.warning("could not save always-allow for %s: %s", tool.label, exc)
            return f"{tool.label}: allowed until localchat exits; saving failed: {exc}"
        with self._lock:
            self._saved.add(key)
        return f"{tool.label}: always allowed (saved in {path})"

    @staticmethod
    def _command(call: ToolCall) -> str:
        command = call.arguments.get("command")
        return command if isinstance(command, str) else json.dumps(call.arguments, sort_keys=True)
