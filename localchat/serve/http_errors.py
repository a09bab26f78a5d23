"""Every error ``localchat serve`` answers with, in one hierarchy (as httpx keeps its own in one
module): each is an HTTP status and a message written for the user, with the fields the API
shapes show (``param``: the field at fault, ``code``: a machine-readable word, ``kind``: OpenAI's
``type``) and any headers the answer carries.

- :class:`Unreadable`: the request cannot be read (malformed, too large, too slow); it is
  answered in OpenAI's shape and the connection is closed.
- :class:`ApiError` and its kinds: a request that was read, answered in the shape of the API its
  path belongs to (``openai_api.error_body``, ``ollama_api.error_body``). Once a stream has begun
  the status cannot change: the error becomes the stream's last event.

Raised anywhere in the server, caught once: ``Unreadable`` by ``http.serve_connection``, an
``ApiError`` by ``app.ServeApp.handle``.
"""

from __future__ import annotations


class ServeError(Exception):
    """An answer that is an error: HTTP ``status``, a ``message`` for the user, the field at
    fault (``param``), a machine-readable ``code``, OpenAI's error ``kind`` and extra
    ``headers``."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = headers or {}


class Unreadable(ServeError):
    """A request that cannot be read (400, 408, 413, 431, 501): answered, then the connection
    is closed, since where the next request would begin is unknown."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)


class ApiError(ServeError):
    """A request that was read and is answered with an error, in its API's shape."""


class BadRequest(ApiError):
    """400: the body, or the field named by ``param``, is not what the API takes (or asks for
    something localchat serve cannot honour)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(400, message, param=param)


def bad(param: str, problem: str) -> BadRequest:
    """A 400 whose message begins with the field at fault: ``messages[2].role is missing``."""
    return BadRequest(f"{param} {problem}", param)


class Refused(ApiError):
    """401 or 403 from the gate (``safety``): a foreign Host or Origin, or no valid API key."""

    def __init__(self, status: int, message: str, code: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message, code=code, headers=headers,
                         kind="authentication_error" if status == 401 else "forbidden")


class NotFound(ApiError):
    """404: no such route, or no such served model (``param="model"``)."""

    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(404, message, param=param, code=code)


class MethodNotAllowed(ApiError):
    """405: the route exists but takes other methods (listed in ``Allow``)."""

    def __init__(self, path: str, method: str, methods: list[str]) -> None:
        allowed = ", ".join(methods)
        super().__init__(405, f"{path} takes {allowed}, not {method}",
                         code="method_not_allowed", headers={"Allow": allowed})


SHUTTING_DOWN = "the server is shutting down"


class ShuttingDown(ApiError):
    """503: the server is stopping; the request was refused, dropped while it waited, or cut
    while it streamed."""

    def __init__(self) -> None:
        super().__init__(503, SHUTTING_DOWN, code="shutting_down", kind="server_error")


class Busy(ApiError):
    """503 with ``Retry-After``: ``max_queue`` requests already wait."""

    def __init__(self, waiting: int, retry_after_s: int) -> None:
        super().__init__(503, f"the server is busy: {waiting} requests are waiting; try again in "
                              f"{retry_after_s} s", code="queue_full", kind="server_error",
                         headers={"Retry-After": str(retry_after_s)})


# Failure codes (events.Failed.code) and the HTTP status each answers with. The 400s are the
# client's messages: too long for the context, or refused by the model's chat template.
_FAILURE_STATUS = {"context_length_exceeded": 400, "conversation_rejected": 400,
                   "format_refused": 400, "shutting_down": 503, "model_not_loaded": 500}
# The field at fault in each 400 (an answer format llama.cpp refused once the model was loaded:
# most often a grammar naming a token the model does not have).
_FAILURE_PARAM = {"context_length_exceeded": "messages", "conversation_rejected": "messages",
                  "format_refused": "grammar"}


class ReplyFailed(ApiError):
    """The engine could not answer (``events.Failed``): a prompt over the context or a
    conversation the chat template refuses (400, ``param`` "messages"), an answer format
    llama.cpp refused over the model's vocabulary (400, ``param`` "grammar"), the model not loadable
    (500), the server stopping (503), or a bug (500)."""

    def __init__(self, message: str, code: str = "") -> None:
        status = _FAILURE_STATUS.get(code, 500)
        super().__init__(status, message, code=code or None,
                         kind="invalid_request_error" if status == 400 else "server_error",
                         param=_FAILURE_PARAM.get(code))
