"""Whether a run may start with what its checkpointDir holds (pure), and that directory as it is on disk."""

from __future__ import annotations

import pytest

from elastic.cli.resume import Verdict, check_resume, resume_verdict

RESUME = "--resume: the job sets no spec.checkpointDir"


@pytest.mark.parametrize(
    ("directory", "contents", "resume", "error", "warning"),
    [
        pytest.param(None, None, False, None, None, id="no checkpointDir: a fresh directory per run"),
        pytest.param(None, None, True, RESUME, None, id="--resume without checkpointDir: nothing to resume"),
        pytest.param("/c", None, False, None, None, id="a new directory"),
        pytest.param("/c", [], False, None, None, id="an empty directory"),
        pytest.param("/c", ["checkpoint.pt"], False, "spec.checkpointDir: /c holds an earlier run's checkpoint "
                     "(checkpoint.pt); run with --resume", None, id="an earlier checkpoint without --resume"),
        pytest.param("/c", ["checkpoint.pt"], True, None, None, id="--resume with a checkpoint"),
        pytest.param("/c", [], True, None, "holds no checkpoint yet; the job starts from scratch",
                     id="--resume with nothing there: a warning"),
        pytest.param("/c", ["e", "d", "c", "b", "a"], False, "(a, b, c, ...)", None, id="a long listing is cut"),
    ],
)  # fmt: skip
def test_resume_verdict(directory, contents, resume, error, warning) -> None:
    verdict = resume_verdict(directory, contents, resume)
    assert (verdict.error is None, verdict.warning is None) == (error is None, warning is None), verdict
    assert error is None or error in verdict.error
    assert warning is None or warning in verdict.warning


def test_check_resume_reads_the_directory(tmp_path) -> None:
    assert check_resume(str(tmp_path / "new"), resume=False) == Verdict()
    (tmp_path / "file").write_text("")
    assert "is not a directory" in check_resume(str(tmp_path / "file"), resume=True).error
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "checkpoint.pt").write_bytes(b"")
    assert "--resume" in check_resume(str(tmp_path / "ckpt"), resume=False).error
    assert check_resume(str(tmp_path / "ckpt"), resume=True) == Verdict()
