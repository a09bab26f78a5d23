"""Errors a user can cause: caught once at the edge (CLI/TUI) and shown in one line."""


class UserError(Exception):
    """Something the user can fix: a bad name, a missing file, a malformed config.

    The message is written for the user and is shown as one line, without a traceback.
    """

    exit_code = 1


class ModelNotFound(UserError):
    """A model was named that is neither in the registry, a hf: reference nor a file."""


class ConfigError(UserError):
    """A config or registry file is malformed (the message names file, line and field)."""


class UsageError(UserError):
    """Flags that do not go together on the command line: exit status 2, as argparse's own."""

    exit_code = 2


class DownloadError(UserError):
    """A pull failed (network, 404, checksum, disk); nothing that looks like a model was left."""


class EngineError(UserError):
    """The engine could not load a model or run a turn (message says what to change)."""


class ConversationRejected(EngineError):
    """The model's chat template refused the conversation (Mistral- and Gemma-style templates
    ``raise_exception`` for two user messages in a row or a system message in the middle): the
    messages must change, not the model (``code`` travels in the turn's ``Failed`` event, so a
    server can answer 400)."""

    code = "conversation_rejected"


class FormatError(UserError):
    """An answer format that cannot be used: a JSON Schema that is not JSON, asks for what cannot
    be enforced or contradicts itself, a grammar that does not parse, an empty short form. Like
    a bad flag, it exits with status 2, before any model loads. Refused while a turn runs (a
    token the grammar names that the model lacks, a grammar that cannot be completed), ``code``
    travels in the turn's ``Failed`` event: the request's shape is at fault, not the model."""

    exit_code = 2
    code = "format_refused"


class ContextOverflow(EngineError):
    """The messages of a turn need more tokens than the context holds (``code`` travels in the
    turn's ``Failed`` event, so a server can answer OpenAI's ``context_length_exceeded``)."""

    code = "context_length_exceeded"

    def __init__(self, needed: int, n_ctx: int, image_tokens: int = 0) -> None:
        images = f" ({image_tokens} of them for its images)" if image_tokens else ""
        super().__init__(f"the conversation needs {needed} tokens{images} but the context holds "
                         f"{n_ctx}; start a new chat or raise n_ctx")
        self.needed = needed
        self.n_ctx = n_ctx
