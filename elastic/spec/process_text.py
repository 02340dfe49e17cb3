"""What a worker's command, arguments, environment and working directory may hold: what `execve` and a pod take.

Why here, at validation: a value that passes the spec but that the operating system refuses (a NUL byte
in an argument, an `=` in an environment variable's name, a lone UTF-16 surrogate that has no bytes, one
string longer than Linux's MAX_ARG_STRLEN) would otherwise be accepted, written to etcd, and only fail when
the controller starts the worker. Each function returns None for a good value, else one user-facing
sentence that says what is wrong and how to fix it.
"""

from __future__ import annotations

from elastic.spec.excerpt import show

# Linux refuses one argv or environment string longer than MAX_ARG_STRLEN (32 pages: 128 KiB with its NUL)
# with E2BIG; a quarter of that is far more than any real argument and leaves room for the name of an
# environment variable and for what the controller adds around it.
MAX_PROCESS_STRING_BYTES = 32 * 1024


def text_problem(value: str) -> str | None:
    """A string that becomes part of a process's argv, environment or working directory."""
    if "\0" in value:
        return f"{show(value)} contains a NUL byte (\\0), which no command line or environment can carry; remove it"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return f"{show(value)} contains a lone UTF-16 surrogate, which has no UTF-8 bytes; remove it"
    if size > MAX_PROCESS_STRING_BYTES:
        return (
            f"{show(value)} is {size} bytes long, more than the {MAX_PROCESS_STRING_BYTES} one argument or "
            "variable may have; pass large data in a file"
        )
    return None


def env_name_problem(name: str) -> str | None:
    """An environment variable's name: printable ASCII without '=' (Kubernetes' relaxed rule, which
    `execve` also needs: `NAME=value` is split at the first '=')."""
    problem = text_problem(name)
    if problem:
        return problem
    if not name:
        return "'' is empty; an environment variable needs a name"
    if "=" in name:
        return f"{show(name)} contains '=', which ends a variable's name; use e.g. {name.replace('=', '_')!r}"
    if not all(" " <= char <= "~" for char in name):
        return f"{show(name)} has a character that is not printable ASCII; use letters, digits and '_'"
    return None
