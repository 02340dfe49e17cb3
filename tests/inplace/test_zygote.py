"""A zygote's worker runs and ends as `python -u script.py` (torchrun's command) does: real forks of a real
forkserver, no torch preloaded, so each case takes milliseconds. The exit code Python would give, `atexit`
handlers run on every end that Python runs them on, unbuffered output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


def test_warm_returns_once_the_preload_is_imported(tmp_path: Path) -> None:
    """An agent joins a round only when it can fork its workers at once: `warm()` waits for the forkserver's
    preload (a newcomer that joined while its zygote still imported torch held the whole job in the new
    round's process group). A fresh interpreter, so that its forkserver is this test's own."""
    (tmp_path / "slow_preload.py").write_text(
        "import os, pathlib, time\ntime.sleep(1.0)\npathlib.Path(os.environ['PRELOADED']).touch()\n")
    marker = tmp_path / "preloaded"
    program = ("import os, sys\nfrom elastic.inplace.zygote import Zygote\n"
               "Zygote(preload=('elastic.inplace.zygote', 'slow_preload')).warm()\n"
               "sys.exit(0 if os.path.exists(os.environ['PRELOADED']) else 7)\n")
    env = {**os.environ, "PRELOADED": str(marker),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", program], env=env, timeout=60)
    assert done.returncode == 0, "warm() returned before the forkserver had imported its preload"
