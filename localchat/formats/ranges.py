"""Integers between bounds as GBNF: what makes a schema's ``minimum`` and ``maximum`` of an
integer hold while the answer is sampled, digit by digit.

The range is split into runs of numbers with the same count of digits, and each run into
digit-class sequences (1-99 becomes ``[1-9] | [1-9] [0-9]``; 15-213 becomes ``"1" [5-9] |
[2-9] [0-9] | "1" [0-9] [0-9] | "20" [0-9] | "21" [0-3]``), the way a regular expression for a
numeric range is usually written. Numbers are written without leading zeros and ``-0`` is
never produced. An open end goes up to ``MAX_DIGITS`` digits, as unbounded integers do.
"""

from __future__ import annotations

from localchat.formats.gbnf import MAX_DIGITS, alternatives, literal, repeat


def integer_range(minimum: int | None, maximum: int | None) -> str:
    """A GBNF term for the integers ``minimum`` ≤ n ≤ ``maximum`` (None: unbounded).
    ValueError when no integer fits."""
    if minimum is not None and maximum is not None and minimum > maximum:
        raise ValueError(f"no integer is at least {minimum} and at most {maximum}")
    options = []
    if minimum is None or minimum < 0:
        # Negative numbers: "-" and a magnitude from max(1, -maximum) up to -minimum.
        low = 1 if maximum is None or maximum >= 0 else -maximum
        options.append('"-" ' + alternatives(_magnitudes(low, None if minimum is None else -minimum)))
    if maximum is None or maximum >= 0:
        options.extend(_magnitudes(max(0, minimum or 0), maximum))
    return alternatives(options)


def _magnitudes(low: int, high: int | None) -> list[str]:
    """GBNF sequences for the numbers ``low`` ≤ n ≤ ``high`` (≥ 0; None: up to MAX_DIGITS
    digits) written without leading zeros."""
    longest = MAX_DIGITS if high is None else len(str(high))
    options = []
    whole: list[int] = []  # lengths (2 or more digits) whose every number is in range
    for digits in range(len(str(low)), longest + 1):
        start = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        end = 10**digits - 1 if high is None else min(high, 10**digits - 1)
        if digits > 1 and start == 10 ** (digits - 1) and end == 10**digits - 1:
            whole.append(digits)
        elif start <= end:
            options.extend(_same_length(str(start), str(end)))
    if whole:  # always consecutive lengths: one term, "[1-9] [0-9]{a,b}"
        options.append(_join("[1-9]", repeat("[0-9]", whole[0] - 1, whole[-1] - 1)))
    return options


def _same_length(low: str, high: str) -> list[str]:
    """GBNF sequences for the digit strings of ``len(low)`` digits between ``low`` and ``high``
    (the same length, low ≤ high; a leading zero is allowed when ``low`` has one)."""
    if not low:
        return [""]
    if low == high:
        return [literal(low)]
    rest = len(low) - 1
    first, last = low[0], high[0]
    if low[1:] == "0" * rest and high[1:] == "9" * rest:
        return [_join(_digit_class(first, last), _any_digits(rest))]
    if first == last:
        return [_join(literal(first), option) for option in _same_length(low[1:], high[1:])]
    options = [_join(literal(first), option) for option in _same_length(low[1:], "9" * rest)]
    if int(last) - int(first) > 1:
        options.append(_join(_digit_class(str(int(first) + 1), str(int(last) - 1)), _any_digits(rest)))
    options.extend(_join(literal(last), option) for option in _same_length("0" * rest, high[1:]))
    return options


def _digit_class(first: str, last: str) -> str:
    return literal(first) if first == last else f"[{first}-{last}]"


def _any_digits(count: int) -> str:
    return repeat("[0-9]", count, count)


def _join(*parts: str) -> str:
    return " ".join(part for part in parts if part)
