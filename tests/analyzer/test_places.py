"""Groups named by members and role; the host of every named rank (slow, dead) in the report and --hosts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from analyzers.diagnosis.hosts import Hosts
from analyzers.textutil import group_text

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "fixtures" / "golden"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flightrec", "analyze", *args, "-q"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_group_text_names_members_and_role() -> None:
    assert group_text("4", "mesh_dp", [1, 3]) == "4 [1, 3] (dp)"
    assert group_text("0", "default_pg", range(4)) == "0 [0-3] (world)"
    assert group_text("5", "undefined", range(0, 1024, 8)) == "5 [128 ranks: every 8th from 0 to 1016]"


def test_cascade_report_names_groups_by_members() -> None:
    out = _cli(str(GOLDEN / "cascade"))
    assert out.stdout.splitlines()[0].startswith("HANG: rank 5 never reached all_reduce #3 of group 4 [1, 5] (dp1)")


def test_slow_report_and_hosts_name_the_slow_rank_host() -> None:
    out = _cli(str(GOLDEN / "straggler_20"))
    assert "  rank 1 (host vm): cost " in "\n".join(out.stdout.splitlines()[:30])
    hosts = _cli(str(GOLDEN / "straggler_20"), "--hosts")
    assert hosts.returncode == 0 and hosts.stdout.split() == ["vm"]


def test_dead_rank_without_placement_says_host_unknown() -> None:
    out = _cli(str(GOLDEN / "crash"))
    assert "  where       host unknown (no dump of its own" in out.stdout
    hosts = _cli(str(GOLDEN / "crash"), "--hosts")
    assert hosts.stdout == "" and "rank 1: host unknown" in hosts.stderr


def test_dead_rank_host_inferred_from_a_peer_on_its_node() -> None:
    meta = {"launcher": "torchrun", "host": "n1", "local_rank": 0, "local_world_size": 4, "node_rank": 1}
    hosts = Hosts({4: meta, 5: {**meta, "local_rank": 1}})
    assert (hosts.place(7)["host"], hosts.place(7)["host_from"], hosts.place(7)["local_rank"]) == ("n1", "peers", 3)
    assert hosts.place(8)["host"] is None and hosts.place(8)["host_detail"]
    assert Hosts({4: {**meta, "launcher": "openmpi"}}).place(7)["host"] is None
