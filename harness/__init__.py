"""Test and benchmark harness: real agents as processes, etcd servers and TLS material as pytest fixtures.

Not runtime code, and not shipped (pyproject packages `elastic*` only): `tests/` loads `harness.fixtures`
as a pytest plugin, and `bench/` drives jobs through `harness.agents`.
"""
