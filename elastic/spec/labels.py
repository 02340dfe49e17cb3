"""Kubernetes' rules for label keys and values and for annotation keys (apimachinery's `IsQualifiedName`,
`IsValidLabelValue`).

Why check them locally: the same job file goes to `kubectl apply`, where the API server refuses a bad key;
a local run that takes it silently would make the file work in one place and not the other.
"""

from __future__ import annotations

import re

from elastic.spec.excerpt import show

_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NAME_MAX = 63
PREFIX_MAX = 253
_NAME_RULE = f"at most {NAME_MAX} letters, digits, '-', '_' and '.', starting and ending with a letter or digit"


def qualified_name_problem(key: str) -> str | None:
    """A label or annotation key: `[prefix/]name`, prefix a DNS-1123 subdomain (e.g. `example.com/team`)."""
    prefix, slash, name = key.rpartition("/")
    if slash and not (prefix and len(prefix) <= PREFIX_MAX and _SUBDOMAIN.fullmatch(prefix)):
        return (
            f"{show(key)} has a bad prefix before '/': it must be a lowercase DNS subdomain of at most "
            f"{PREFIX_MAX} characters, e.g. 'example.com/{name or 'key'}'"
        )
    if not (len(name) <= NAME_MAX and _NAME.fullmatch(name)):
        return f"{show(key)} is not a valid key; the name (after any 'prefix/') must have {_NAME_RULE}"
    return None


def label_value_problem(value: str) -> str | None:
    """A label value: empty, or a name as in a key (Kubernetes selects on it, so it is short and plain)."""
    if value == "" or (len(value) <= NAME_MAX and _NAME.fullmatch(value)):
        return None
    return f"{show(value)} is not a valid label value; use {_NAME_RULE} (or an annotation for free text)"
