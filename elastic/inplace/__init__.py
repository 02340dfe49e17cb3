"""In-place recovery (`recovery: InPlace`): survivors keep their processes across a membership change.

`zygote` starts workers as forks of a warm process; `agent` is the per-node loop that keeps survivors
running and replaces only what died; the workers' side is `elastic.train`.
"""
