"""The benchmarks run: each script, with the tiniest settings, exits 0 and ends with RESULT lines.

Why: bench/ is not part of the test suite, but a benchmark that no longer starts (an API moved, a log line
changed) should be caught before someone spends an hour on a full run. Speed is not judged here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
RESULT = re.compile(r"^RESULT (\S+) etcd-v3=(\S+) c10d=(\S+) ratio=(\S+)$", re.M)

pytestmark = pytest.mark.slow


def run_bench(script: str, *args: str, timeout: float = 240) -> str:
    completed = subprocess.run(
        [sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=timeout,
        cwd=BENCH.parent,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed.stdout


def results(output: str) -> dict[str, tuple[str, str, str]]:
    found = {m[1]: (m[2], m[3], m[4]) for m in RESULT.finditer(output)}
    assert found, f"no RESULT lines in:\n{output[-3000:]}"
    return found


def test_recovery_cold_start_runs(tmp_path: Path) -> None:
    out = run_bench("recovery.py", "--repeat", "1", "--scenarios", "cold_start", "--variants", "etcd-v3,c10d-equal",
                    "--out", str(tmp_path))
    found = results(out)
    etcd_v3, c10d, _ = found["cold_start_s_equal"]
    assert float(etcd_v3) > 0 and float(c10d) > 0, found
    assert (tmp_path / "recovery_runs.csv").exists()
    # the rows written as the run went can be reported again (how a split run is joined)
    again = results(run_bench("recovery.py", "--from-csv", str(tmp_path / "recovery_runs.csv"),
                              "--variants", "etcd-v3,c10d-equal"))
    assert again["cold_start_s_equal"] == found["cold_start_s_equal"]


def test_scale_runs_with_four_members(tmp_path: Path) -> None:
    out = run_bench("scale.py", "--sizes", "4", "--repeat", "1", "--timeout", "60", "--lease-seconds", "2",
                    "--out", str(tmp_path))
    found = results(out)
    assert {"rdzv_4_members_s_defaults", "rdzv_4_members_s_equal", "store_requests_per_round_4"} <= set(found)
    assert float(found["rdzv_4_members_s_defaults"][0]) > 0
    line = re.search(r"^RESULT rendezvous_members_4_s=(\S+) (.+)$", out, re.M)
    assert line, f"no per-member RESULT line in:\n{out[-3000:]}"
    member = dict(pair.split("=") for pair in line[2].split())
    assert float(line[1]) > 0 and float(member["bytes_per_member"]) > 0 and float(member["events_per_member"]) > 0
    # the member lost is noticed through its lapsed lease (2 s, from its last keep-alive, sent every 2/3 s at
    # most: 4/3 s after its death at the earliest), and the 3 others go on
    assert 2.0 * 2 / 3 - 0.1 <= float(member["loss_to_next_round_s"]) < 30, member
    # the round's end is read from the next round's record: after the loss, before every survivor's rank
    assert 0 <= float(member["loss_ranked_after_round_end_s"]) < float(member["loss_to_next_round_s"]), member
    assert (tmp_path / "scale_runs.csv").exists()


def test_scale_survives_the_loss_of_the_sealer() -> None:
    """The member that seals the rounds dies: the others see its key go, elect another, which ends the round on
    the loss; the three left are ranked again."""
    out = run_bench("scale.py", "--sizes", "4", "--repeat", "1", "--backends", "etcd-v3", "--lose", "sealer",
                    "--timeout", "60", "--lease-seconds", "2")
    line = re.search(r"^RESULT rendezvous_members_4_s=(\S+) (.+)$", out, re.M)
    assert line, f"no per-member RESULT line in:\n{out[-3000:]}"
    member = dict(pair.split("=") for pair in line[2].split())
    assert 2.0 * 2 / 3 - 0.1 <= float(member["loss_to_next_round_s"]) < 30, member


def test_scale_ranks_256_members_each_watching_a_few_keys() -> None:
    """Issue 27: 256 members, 16 per process, each its own handler, lease and etcd connection, are ranked; what
    one member receives stays a few watch events and a few KiB (each used to receive every other's join)."""
    out = run_bench("scale.py", "--sizes", "256", "--repeat", "1", "--backends", "etcd-v3", "--no-loss",
                    "--timeout", "120", timeout=300)
    line = re.search(r"^RESULT rendezvous_members_256_s=(\S+) (.+)$", out, re.M)
    assert line and line[1] != "nan", f"256 members were not all ranked:\n{out[-3000:]}"
    member = dict(pair.split("=") for pair in line[2].split())
    assert float(member["events_per_member"]) < 10 and float(member["bytes_per_member"]) < 8 * 1024, member


def test_overhead_runs(tmp_path: Path) -> None:
    out = run_bench("overhead.py", "--repeat", "1", "--window", "2", "--warmup", "0.5",
                    "--variants", "etcd-v3,c10d-defaults", "--out", str(tmp_path))
    found = results(out)
    assert float(found["steps_per_s_defaults"][0]) > 0, found
    assert "store_requests_per_s_steady" in found


def test_kube_api_runs() -> None:
    out = run_bench("kube_api.py", "--jobs", "2", "--pods", "2", "--seconds", "4", "--changes", "2")
    line = re.search(r"^RESULT kube_api_requests_per_min (.+)$", out, re.M)
    assert line, f"no RESULT line in:\n{out[-3000:]}"
    found = dict(pair.split("=") for pair in line[1].split())
    assert {"total", "list", "watch", "get", "create", "patch", "delete", "cpu_s_per_min"} <= set(found), found
    assert float(found["cpu_s_per_min"]) > 0, found  # (3 s may hold no Lease renewal: requests can be 0)
    scale = re.search(r"^RESULT kube_controller_scale (.+)$", out, re.M)
    assert scale, f"no scale RESULT line in:\n{out[-3000:]}"
    found = dict(pair.split("=") for pair in scale[1].split())
    # a pod failing and a spec edit were made, and at least the first was reconciled within the window
    assert found["changes"] == "2" and int(found["unreconciled"]) <= 1, found
    assert float(found["change_to_reconcile_p50_s"]) >= 0 and float(found["rss_mib"]) > 0, found



def test_local_jobs_runs() -> None:
    out = run_bench("local_jobs.py", "--jobs", "3", "--workers", "2", "--seconds", "4", "--changes", "2",
                    "--settle", "0.5")
    line = re.search(r"^RESULT local_controller_scale (.+)$", out, re.M)
    assert line, f"no RESULT line in:\n{out[-3000:]}"
    found = dict(pair.split("=") for pair in line[1].split())
    # an agent lost and a spec edit were made, both reconciled: the watch queues the job, nothing polls
    assert found["changes"] == "2" and found["unreconciled"] == "0", found
    assert float(found["change_to_reconcile_p99_s"]) < 4 and float(found["rss_mib"]) > 0, found
    assert float(found["etcd_requests_per_min"]) > 0, found

HOT_RESULT = re.compile(
    r"^RESULT hot_worker_crash_recovery_s median=(\S+) p90=(\S+) restart=(\S+) c10d_defaults=(\S+) "
    r"ratio_vs_restart=(\S+) ratio_vs_c10d=(\S+) clean=(\d+)/(\d+)$", re.M)


def test_recovery_hot_runs(tmp_path: Path) -> None:
    out = run_bench("recovery.py", "--hot", "--incidents", "1", "--blocks", "1", "--sizes", "2",
                    "--scenarios", "worker_crash", "--variants", "in-place,in-place-ddp,restart", "--hidden", "64",
                    "--step-seconds", "0.05", "--timeout", "30", "--out", str(tmp_path), timeout=120)
    line = HOT_RESULT.search(out)
    assert line, f"no hot RESULT line in:\n{out[-3000:]}"
    median, _, restart, c10d, _, _, _, incidents = line.groups()
    assert float(median) > 0 and float(restart) > 0 and c10d == "nan", line[0]
    assert incidents == "1", line[0]
    assert "| worker_crash | 2" in out and "detect" in out, out[-3000:]  # the table and the in-place phases
    assert re.search(r"^RESULT hot_ddp_worker_crash_recovery_s median=\d", out, re.M), out[-3000:]
    assert (tmp_path / "hot_runs.csv").exists()


CHURN_RESULT = re.compile(
    r"^RESULT churn_goodput in_place_spares=(\S+) in_place=(\S+) restart=(\S+) c10d=(\S+) ratio_vs_c10d=(\S+)$", re.M)


def test_churn_runs(tmp_path: Path) -> None:
    out = run_bench("churn.py", "--duration", "12", "--agents", "3", "--variants", "in-place", "--hidden", "64",
                    "--step-seconds", "0.05", "--start-timeout", "40", "--out", str(tmp_path), timeout=90)
    line = CHURN_RESULT.search(out)
    assert line, f"no churn RESULT line in:\n{out[-3000:]}"
    spares, in_place, restart, c10d, ratio = line.groups()
    assert float(in_place) > 0 and (spares, restart, c10d, ratio) == ("nan",) * 4, line[0]
    assert "| in-place " in out and "charges" in out, out[-3000:]  # the table
    assert (tmp_path / "churn_runs.csv").exists() and (tmp_path / "churn_events.csv").exists()
    # the rows written as the run went can be reported again
    again = run_bench("churn.py", "--from-csv", str(tmp_path / "churn_runs.csv"), "--agents", "3",
                      "--duration", "12", "--variants", "in-place")
    assert CHURN_RESULT.search(again)[0] == line[0]  # type: ignore[index]


TORCHFT_RESULT = re.compile(
    r"^RESULT hot_worker_crash_vs_torchft median=(\S+) torchft=(\S+) ratio_vs_torchft=(\S+) stall_s=(\S+) "
    r"steps_lost=(\S+) torchft_stall_s=(\S+) torchft_steps_lost=(\S+)$", re.M)


def test_recovery_hot_runs_torchft(tmp_path: Path) -> None:
    """One torchft incident beside one of ours (torchft is an optional extra: CI does not install it)."""
    pytest.importorskip("torchft", reason="torchft is not installed (make bench-peers installs the peers extra)")
    out = run_bench("recovery.py", "--hot", "--incidents", "1", "--blocks", "1", "--sizes", "2",
                    "--scenarios", "worker_crash", "--variants", "in-place,torchft-tuned", "--hidden", "64",
                    "--step-seconds", "0.05", "--timeout", "30", "--out", str(tmp_path), timeout=180)
    line = TORCHFT_RESULT.search(out)
    assert line, f"no torchft RESULT line in:\n{out[-3000:]}"
    median, torchft, _, stall, lost, torchft_stall, torchft_lost = line.groups()
    assert float(median) > 0 and float(torchft) > 0 and float(stall) > 0 and float(torchft_stall) > 0, line[0]
    assert lost == torchft_lost == "0", line[0]  # neither redoes a committed step
    assert HOT_RESULT.search(out), out[-3000:]  # ours as before
    assert "stall_s" in (tmp_path / "hot_runs.csv").read_text().splitlines()[0]
