"""`elastic completion bash|zsh`: a shell completion script for the verbs and options of this `elastic`.

Written from the parser itself, so it never lists a verb or an option the command line does not have.
zsh runs the same script through its `bashcompinit`. Install: `source <(elastic completion bash)` in
~/.bashrc, or `source <(elastic completion zsh)` in ~/.zshrc.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable

SHELLS = ("bash", "zsh")
EMPTY = '""'  # the case pattern of no verb yet


def register(verbs: argparse._SubParsersAction, root: Callable[[], argparse.ArgumentParser]) -> None:
    completion = verbs.add_parser("completion", help="print a bash or zsh completion script",
                                  description=__doc__.split("\n\n")[0])
    completion.add_argument("shell", choices=SHELLS)
    completion.set_defaults(run=lambda args: print(script(root(), args.shell), end="") or 0)


def words(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Each verb (and `verb fault` for nested verbs) with its options; "" holds the verbs themselves."""
    found: dict[str, list[str]] = {}

    def walk(current: argparse.ArgumentParser, path: str) -> None:
        options: list[str] = []
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                options += list(action.choices)
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}".strip())
            else:
                options += [o for o in action.option_strings if o.startswith("--") or len(o) == 2]
        found[path] = options

    walk(parser, "")
    return found


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    cases = "\n".join(
        f"    {shlex.quote(path) if path else EMPTY}) words={shlex.quote(' '.join(options))} ;;"
        for path, options in sorted(words(parser).items())
    )
    text = f"""# elastic {shell} completion: source <(elastic completion {shell})
_elastic() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" path="" word words i
  for ((i = 1; i < COMP_CWORD; i++)); do
    word="${{COMP_WORDS[i]}}"
    case "$word" in -*) continue ;; esac
    case "${{path:+$path }}$word" in
{_known(parser)}) path="${{path:+$path }}$word" ;;
      *) break ;;
    esac
  done
  case "$path" in
{cases}
    *) words="" ;;
  esac
  if [[ "$cur" == -* || -z "$path" ]]; then
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
  else
    COMPREPLY=($(compgen -W "$words" -- "$cur") $(compgen -f -- "$cur"))
  fi
}}
complete -F _elastic elastic
"""
    if shell == "zsh":
        text = "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n" + text
    return text


def _known(parser: argparse.ArgumentParser) -> str:
    paths = [p for p in words(parser) if p]
    return "      " + "|".join(shlex.quote(p) for p in sorted(paths))
