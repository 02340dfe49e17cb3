"""How a user's value appears in an error message: short, and found without walking all of it.

A document may hold a megabyte string or a list of ten thousand items; `repr()` of it would flood the
terminal (and, for a structure that shares its parts, take minutes). `reprlib` looks at only the first
few items of each level, so the cost of `show` does not grow with the value.
"""

from __future__ import annotations

import reprlib
from typing import Any

MAX_CHARS = 60


class _Excerpt(reprlib.Repr):
    """reprlib with a *prefix* of long strings (reprlib keeps both ends; users recognise a value by its start)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 2
        self.maxlist = self.maxtuple = self.maxset = self.maxdict = 4
        self.maxstring = self.maxother = MAX_CHARS
        self.maxlong = MAX_CHARS

    def repr_str(self, x: str, level: int) -> str:
        return repr(x[: self.maxstring + 1])

    def repr_int(self, x: int, level: int) -> str:
        # repr() of an int beyond 4300 digits raises; bit_length is cheap at any size.
        if x.bit_length() > 4 * self.maxlong:
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_EXCERPT = _Excerpt()


def cut(text: str, limit: int = MAX_CHARS) -> str:
    """`text` itself if short, else its first characters and '...'."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def show(value: Any) -> str:
    """The value as the user would recognise it (Python literal syntax), at most MAX_CHARS characters."""
    return cut(_EXCERPT.repr(value))
