"""A zygote's worker runs and ends as `python -u script.py` (torchrun's command) does: real forks of a real
forkserver, no torch preloaded, so each case takes milliseconds. The exit code Python would give, `atexit`
handlers run on every end that Python runs them on, unbuffered output."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic.inplace.zygote import WorkerCommand, Zygote


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    """A zygote whose own output is buffered, as an agent started without PYTHONUNBUFFERED gets."""
    with pytest.MonkeyPatch.context() as env:
        env.delenv("PYTHONUNBUFFERED", raising=False)
        zygote = Zygote(preload=("elastic.inplace.zygote",))
        zygote.warm()
    yield zygote


CASES = {
    "a script that returns exits 0": ("pass", 0),
    "sys.exit(3) exits 3": ("import sys; sys.exit(3)", 3),
    "sys.exit with a message exits 1": ("import sys; sys.exit('stopped')", 1),
    "an uncaught exception exits 1": ("raise ValueError('bad')", 1),
    "an uncaught KeyboardInterrupt ends by SIGINT": ("raise KeyboardInterrupt", -signal.SIGINT),
    "stdout and stderr are unbuffered, as under torchrun's python -u": (
        "import sys; sys.exit(0 if sys.stdout.write_through and sys.stderr.write_through else 5)", 0),
}


@pytest.mark.parametrize(("body", "code"), list(CASES.values()), ids=list(CASES))
def test_a_worker_runs_and_ends_as_python_runs_a_script(zygote: Zygote, tmp_path: Path, body: str, code: int) -> None:
    script = tmp_path / "script.py"
    script.write_text("import atexit, pathlib\n"
                      "atexit.register(lambda: pathlib.Path('atexit-ran').touch())\n" + body + "\n")
    worker = zygote.start(WorkerCommand(str(script), cwd=str(tmp_path)), name="worker-0")
    worker.join(30)
    assert worker.exitcode == code
    assert (tmp_path / "atexit-ran").exists()
