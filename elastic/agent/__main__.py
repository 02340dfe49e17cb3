"""`python -m elastic.agent ARGS`: the same as `elastic agent ARGS` (torchrun's arguments)."""

from elastic.agent import main

main()
