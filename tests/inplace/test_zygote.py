"""A zygote's worker ends as `python script.py` ends (real forks of a real forkserver; no torch preloaded, so
each case takes milliseconds): the exit code Python would give, and `atexit` handlers run on every end
that Python runs them on."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic.inplace.zygote import WorkerCommand, Zygote


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    zygote = Zygote(preload=("elastic.inplace.zygote",))
    zygote.warm()
    yield zygote


CASES = {
    "a script that returns exits 0": ("pass", 0),
    "sys.exit(3) exits 3": ("import sys; sys.exit(3)", 3),
    "sys.exit with a message exits 1": ("import sys; sys.exit('stopped')", 1),
    "an uncaught exception exits 1": ("raise ValueError('bad')", 1),
    "an uncaught KeyboardInterrupt ends by SIGINT": ("raise KeyboardInterrupt", -signal.SIGINT),
}


@pytest.mark.parametrize(("body", "code"), list(CASES.values()), ids=list(CASES))
def test_a_worker_ends_with_the_interpreters_exit_code_after_atexit(zygote: Zygote, tmp_path: Path, body: str,
                                                                     code: int) -> None:
    script = tmp_path / "script.py"
    script.write_text("import atexit, pathlib\n"
                      "atexit.register(lambda: pathlib.Path('atexit-ran').touch())\n" + body + "\n")
    worker = zygote.start(WorkerCommand(str(script), cwd=str(tmp_path)), name="worker-0")
    worker.join(30)
    assert worker.exitcode == code
    assert (tmp_path / "atexit-ran").exists()
