"""`elastic completion bash|zsh`: a shell completion script for the verbs and options of this `elastic`.

Written from the parser itself, so it never lists a verb or an option the command line does not have.
Job names complete from the default etcd ($ELASTIC_ETCD or a running local `elastic etcd`). zsh runs
the same script through its `bashcompinit`. Install: `source <(elastic completion bash)` in
~/.bashrc, or `source <(elastic completion zsh)` in ~/.zshrc.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable

SHELLS = ("bash", "zsh")
EMPTY = '""'  # the case pattern of no verb yet
# Verbs whose argument is a job: completed with the jobs of the default etcd (`elastic status -o name`).
JOB_VERBS = ("status", "describe", "logs", "delete", "scale", "chaos kill")


def register(verbs: argparse._SubParsersAction, root: Callable[[], argparse.ArgumentParser]) -> None:
    completion = verbs.add_parser("completion", help="print a bash or zsh completion script",
                                  description=__doc__.split("\n\n")[0])
    completion.add_argument("shell", choices=SHELLS)
    completion.set_defaults(run=lambda args: print(script(root(), args.shell), end="") or 0)


def words(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Each verb (and `verb fault` for nested verbs) with its options and fixed words; "" holds the verbs."""
    found: dict[str, list[str]] = {}

    def walk(current: argparse.ArgumentParser, path: str) -> None:
        options: list[str] = []
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                options += list(action.choices)
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}".strip())
            elif action.option_strings:
                options += [o for o in action.option_strings if o.startswith("--") or len(o) == 2]
            elif action.choices:  # a positional's fixed words (`etcd start|stop|status`, `completion bash`)
                options += list(action.choices)
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
  local cur="${{COMP_WORDS[COMP_CWORD]}}" path="" given="" word words i
  for ((i = 1; i < COMP_CWORD; i++)); do
    word="${{COMP_WORDS[i]}}"
    case "$word" in -*) continue ;; esac
    case "${{path:+$path }}$word" in
{_known(parser)}) path="${{path:+$path }}$word" ;;
      *) given=1; break ;;
    esac
  done
  local jobs=""
  case "$path" in {'|'.join(shlex.quote(v) for v in JOB_VERBS)}) jobs=1 ;; esac
  case "$path" in
{cases}
    *) words="" ;;
  esac
  if [[ "$cur" == -* || -z "$path" ]]; then
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
  elif [[ -z "$given" && -n "$jobs" ]]; then  # the job argument: the jobs of the default etcd
    COMPREPLY=($(compgen -W "$(elastic status -o name 2>/dev/null)" -- "$cur"))
  else  # a verb's own verbs (chaos kill), else file names (JOB.yaml)
    local verbs="" w
    for w in $words; do [[ "$w" == -* ]] || verbs="$verbs $w"; done
    if [[ -n "$verbs" ]]; then
      COMPREPLY=($(compgen -W "$verbs" -- "$cur"))
    else
      COMPREPLY=($(compgen -f -- "$cur"))
    fi
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
