"""What a failed remote request says: the wait a ``Retry-After`` asks for and when to try again,
a timeout or a transport error in one line, the start of an error answer's body."""

from __future__ import annotations

import math
import time
from email.utils import parsedate_to_datetime

import httpx


def read_at_most(response: httpx.Response, limit: int) -> str:
    """The start of a (non-200) body as text: a broken server's endless error page is not read."""
    body = bytearray()
    for data in response.iter_bytes():
        body += data
        if len(body) >= limit:
            break
    return bytes(body[:limit]).decode(response.encoding or "utf-8", errors="replace")


def retry_after_s(header: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date); None when
    absent or unreadable (then the usual immediate retry applies)."""
    if not header:
        return None
    header = header.strip()
    if header.isdigit():
        return float(header)
    try:
        when = parsedate_to_datetime(header)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # HTTP dates are GMT; a zone-less one is read as such too
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def try_again_hint(retry_after_s: float | None) -> str:
    """"; the remote asks to wait 120 s; try again after 14:03" for a failure with Retry-After."""
    if not retry_after_s:
        return ""
    asks = f"; the remote asks to wait {seconds(retry_after_s)} s"
    if retry_after_s < 60:
        return asks
    until = time.localtime(math.ceil((time.time() + retry_after_s) / 60) * 60)
    same_day = until[:3] == time.localtime()[:3]
    clock = time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", until)
    return f"{asks}; try again after {clock}"


def seconds(value: float) -> str:
    return f"{math.ceil(value):d}" if value >= 1 else f"{value:.1g}"


def timeout_message(exc: httpx.TimeoutException, timeout_s: float) -> str:
    if isinstance(exc, httpx.ConnectTimeout):
        return f"could not connect to the remote within {timeout_s:g} s"
    if isinstance(exc, httpx.ReadTimeout):
        return f"the remote sent nothing for {timeout_s:g} s (timeout_s)"
    return f"the remote request timed out after {timeout_s:g} s"


def reason(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]
