"""`flightrec export DIR --trace FILE`: the Chrome trace-event timeline (docs/timeline.md).

Checked two ways: against the dumps themselves (every slice is an entry's measured start and end, or
its start and its rank's dump time when it was pending; nothing polled is drawn), and by a real
consumer of the format: the trace engine of Chrome DevTools' Performance panel, which ships inside
Chromium, run in headless Chromium (Perfetto's trace processor and chrome://tracing are not
available offline here: the one is a binary fetched at run time, the other is no longer built in).
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import select
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import analyzers
from analyzers.cli import analyze_command, export_command
from analyzers.reporting import trace_events
from analyzers.reporting.trace_events import LANE_STRIDE, trace_dict, write_trace
from fixtures.builders import Job
from fixtures.run import SCENARIOS, run_scenario
from tests.child import command, env_with_root
from tests.helpers import entries, load_dump

from .conftest import GOLDEN, ROOT

PENDING = ("enqueued", "started")


def _write(folder: Path, out: Path) -> tuple[analyzers.Analysis, dict[str, Any]]:
    a = analyzers.load(str(folder))
    write_trace(a, out)
    return a, json.loads(out.read_text(encoding="utf-8"))


def _tracks(trace: dict[str, Any]) -> tuple[dict[int, str], dict[tuple[int, int], str], dict[tuple[int, int], int]]:
    """process names by pid, thread names and sort indexes by (pid, tid)."""
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    order = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in meta if e["name"] == "thread_sort_index"}
    return procs, threads, order


def _check_structure(trace: dict[str, Any], a: analyzers.Analysis) -> None:
    """What any trace must satisfy: object form, a named track per rank under its host's process, no
    negative time, declared tracks only, and no two slices of one track overlapping without nesting."""
    assert set(trace) == {"traceEvents", "displayTimeUnit", "metadata"}
    assert trace["displayTimeUnit"] == "ms" and trace["metadata"]["schema"] == trace_events.TRACE_SCHEMA
    procs, threads, order = _tracks(trace)
    ranks = sorted(set(a.graph.nodes) | set(a.dumps))
    for r in ranks:
        (pid,) = [p for (p, t) in threads if t == r]  # exactly one main track per rank
        host = a.dumps[r].meta.get("host") if r in a.dumps else None
        assert procs[pid] == (host or "host unknown"), (r, procs[pid])
        assert threads[(pid, r)].startswith(f"rank {r}") and order[(pid, r)] == r
    assert {t % LANE_STRIDE for (_, t) in threads} == set(ranks)
    assert all(name.startswith(f"rank {t % LANE_STRIDE}") for (_, t), name in threads.items())
    drawn = [e for e in trace["traceEvents"] if e["ph"] in ("X", "i")]
    assert all((e["pid"], e["tid"]) in threads and e["ts"] >= 0 for e in drawn)
    assert all(e["dur"] >= 0 for e in drawn if e["ph"] == "X")
    assert all(e["s"] == "t" for e in drawn if e["ph"] == "i")
    by_track: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in drawn:
        if e["ph"] == "X":
            by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        assert all(b[0] >= a_[1] - 1e-6 for a_, b in zip(spans, spans[1:], strict=False)), spans
    ops = trace["metadata"]["ops"]
    op_events = [e for e in drawn if e.get("cat") in ("coll", "p2p")]
    assert ops["slices"] + ops["pending_slices"] == sum(e["ph"] == "X" for e in op_events)
    assert ops["start_only"] == sum(e["ph"] == "i" for e in op_events)


def _expected_ops(folder: Path, ranks: list[int], t0: int) -> tuple[Counter[tuple[Any, ...]], int]:
    """The ops a trace must draw, from the raw dumps (not through the analyzer): a slice from each
    measured start to its measured end, or to the dump time for a pending op; plus how many entries
    have no measured start (not drawn)."""
    want: Counter[tuple[Any, ...]] = Counter()
    left_out = 0
    for r in ranks:
        dump = load_dump(folder, r)
        offset = dump["clock"]["wall_ns"] - dump["clock"]["mono_ns"]
        for e in entries(dump):
            if e["t_enqueue_ns"] is None:
                left_out += 1
                continue
            start = e["t_enqueue_ns"] + offset
            if e["t_complete_ns"] is not None:
                end = e["t_complete_ns"] + offset
            elif e["state"] in PENDING:
                end = dump["dump_time_ns"]
            else:
                want[(r, e["op"], e["group"], e["seq"], "i", round((start - t0) / 1000, 3), None)] += 1
                continue
            want[(r, e["op"], e["group"], e["seq"], "X", round((start - t0) / 1000, 3), round((end - start) / 1000, 3))] += 1
    return want, left_out


def _drawn_ops(trace: dict[str, Any]) -> Counter[tuple[Any, ...]]:
    return Counter((e["tid"] % LANE_STRIDE, e["args"].get("op", e["name"]), e["args"]["group"], e["args"]["seq"], e["ph"], round(e["ts"], 3),
                    round(e["dur"], 3) if e["ph"] == "X" else None)
                   for e in trace["traceEvents"] if e.get("cat") in ("coll", "p2p") and e["ph"] in ("X", "i"))


def test_a_real_hang_as_a_timeline(tmp_path: Path) -> None:
    """compute_hang (a real gloo run): rank 2 sleeps before the 4th all_reduce, the others wait in it."""
    folder = GOLDEN / "compute_hang"
    a, trace = _write(folder, tmp_path / "trace.json")
    _check_structure(trace, a)
    rep = a.report()
    meta = trace["metadata"]
    t0 = meta["t0_wall_ns"]
    want, left_out = _expected_ops(folder, sorted(a.dumps), t0)
    assert _drawn_ops(trace) == want and meta["ops"]["left_out"] == left_out == 0
    assert meta["verdict"] == rep["verdict"] and "wall clock" in meta["clock"]

    culprits = {c["rank"]: c["kind"] for c in rep["root_causes"]}
    assert culprits == SCENARIOS["compute_hang"].root_causes  # the injected fault, not a number picked here
    (culprit, kind), = culprits.items()
    procs, threads, _ = _tracks(trace)
    assert [name for (_, t), name in threads.items() if "root cause" in name] == [f"rank {culprit} — root cause: {kind}"]
    (marker,) = [e for e in trace["traceEvents"] if e.get("cat") == "root_cause"]
    assert (marker["ph"], marker["s"], marker["tid"], marker["name"]) == ("i", "t", culprit, f"root cause: {kind}")
    assert marker["ts"] == pytest.approx((load_dump(folder, culprit)["dump_time_ns"] - t0) / 1000, abs=1e-3)
    assert marker["args"]["kind"] == kind and "dump time" in marker["args"]["time"]

    completed_colours = {e.get("cname") for e in trace["traceEvents"] if e.get("args", {}).get("state") == "completed"}
    pending = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["args"]["state"] in PENDING]
    waiters = {w["rank"]: w for w in rep["waits"]}
    assert sorted(e["tid"] for e in pending) == sorted(waiters) and culprit not in waiters
    for e in pending:
        w = waiters[e["tid"]]
        assert (e["name"], e["args"]["op"]) == (f"{w['op']} (blocking)", w["op"])  # its own colour in Perfetto too
        assert (e["args"]["group"], e["args"]["seq"]) == (w["group"], w["seq"])
        assert e["args"]["status"] == "blocking" and e["args"]["waits_for"] == f"rank {culprit}"
        assert e["cname"] not in completed_colours and "dump time" in e["args"]["end"]
        dump_at = (load_dump(folder, e["tid"])["dump_time_ns"] - t0) / 1000
        assert e["ts"] + e["dur"] == pytest.approx(dump_at, abs=1e-3)
    flows = [e for e in trace["traceEvents"] if e["ph"] in ("s", "f")]
    starts = {e["id"]: e for e in flows if e["ph"] == "s"}
    ends = {e["id"]: e for e in flows if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and sorted(s["tid"] for s in starts.values()) == sorted(waiters)
    assert all(ends[i]["tid"] == culprit and ends[i]["bp"] == "e" for i in ends)
    slices = {(e["tid"], e["ts"]) for e in trace["traceEvents"] if e["ph"] == "X"}
    assert all((e["tid"], e["ts"]) in slices for e in flows)  # each end at the start of a slice of its track


def test_a_rank_without_a_dump_keeps_its_track(tmp_path: Path) -> None:
    """crash (a real run): rank 1 died without a dump; its track exists, under no known host, marked."""
    a, trace = _write(GOLDEN / "crash", tmp_path / "trace.json")
    _check_structure(trace, a)
    procs, threads, _ = _tracks(trace)
    (missing,) = a.missing
    (pid,) = [p for (p, t) in threads if t == missing]
    assert procs[pid] == "host unknown" and "(no dump)" in threads[(pid, missing)]
    (marker,) = [e for e in trace["traceEvents"] if e.get("cat") == "root_cause"]
    assert marker["tid"] == missing and "no record of this rank" in marker["args"]["time"]
    first_wait = min(e["ts"] for e in trace["traceEvents"] if e["ph"] == "X" and e["args"].get("status") == "blocking")
    assert marker["ts"] == first_wait
    assert not [e for e in trace["traceEvents"] if e["ph"] in ("X", "i") and e["tid"] == missing and e is not marker]


def test_start_only_ops_are_instants(tmp_path: Path) -> None:
    """PyTorch's gloo recorder (a real run) records no completion time and no dump time: every op is
    an instant at its measured start, none is given a duration."""
    a, trace = _write(GOLDEN / "torch_fr_gloo", tmp_path / "trace.json")
    _check_structure(trace, a)
    ops = [e for e in trace["traceEvents"] if e.get("cat") in ("coll", "p2p") and e["ph"] in ("X", "i")]
    assert ops and all(e["ph"] == "i" and "dur" not in e and "start only" in e["args"]["end"] for e in ops)
    assert len(ops) == len(a.entries)
    pending = [e for e in ops if e["args"]["state"] in PENDING]
    assert pending and all("does not say when" in e["args"]["end"] for e in pending)
    (marker,) = [e for e in trace["traceEvents"] if e.get("cat") == "root_cause"]
    assert "last recorded time" in marker["args"]["time"]
    assert marker["ts"] == max(e["ts"] for e in ops if e["tid"] == marker["tid"])


@pytest.mark.parametrize("torch_recorder", ["off", "on"])
def test_polled_times_are_never_durations(tmp_path: Path, torch_recorder: str) -> None:
    """A real DDP run: the Reducer's all-reduces are issued from C++. Without PyTorch's recorder their
    times are only when the watchdog's polling saw them (`t_seen_ns`): not drawn, counted. With it,
    they carry its measured start (gloo: no end) and are drawn at it."""
    env = env_with_root({"FLIGHTREC": "1", "FLIGHTREC_DIR": str(tmp_path / "dumps"), "RANK": "0", "WORLD_SIZE": "1",
                         "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "FLIGHTREC_DUMP_ON_EXIT": "1",
                         **({"TORCH_FR_BUFFER_SIZE": "0"} if torch_recorder == "off" else {})})
    # four DDP steps, then one all_reduce from Python (tests/recorder/one_rank_jobs.py)
    run = subprocess.run(command("tests.recorder.one_rank_jobs", "ddp_steps", 4, 1), capture_output=True, text=True,
                         timeout=120, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stderr
    a, trace = _write(tmp_path / "dumps", tmp_path / "trace.json")
    _check_structure(trace, a)
    raw = entries(load_dump(tmp_path / "dumps", 0))
    cpp = [e for e in raw if e["source"] == "c++"]
    assert cpp
    want, left_out = _expected_ops(tmp_path / "dumps", [0], trace["metadata"]["t0_wall_ns"])
    assert _drawn_ops(trace) == want and trace["metadata"]["ops"]["left_out"] == left_out
    drawn_cpp = [e for e in trace["traceEvents"] if e.get("args", {}).get("api") == "c++"]
    if torch_recorder == "off":
        assert all(e["t_seen_ns"] is not None for e in cpp) and left_out == len(cpp) and not drawn_cpp
        assert "polling" in trace["metadata"]["left_out"]["why"]
        assert [e["name"] for e in trace["traceEvents"] if e["ph"] in ("X", "i")] == ["all_reduce"]
    else:
        assert left_out == 0 and len(drawn_cpp) == len(cpp)  # at PyTorch's measured start; a slice only
        ended = {(e["group"], e["seq"]): e["t_complete_ns"] is not None for e in cpp}  # where it measured the end
        assert {(e["args"]["group"], e["args"]["seq"]): e["ph"] == "X" for e in drawn_cpp} == ended, cpp


@pytest.fixture(scope="module")
def batch_ring(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """batch_ring (a real torchrun job): rank 2 never posts its receive of a batch_isend_irecv ring."""
    folder = tmp_path_factory.mktemp("batch_ring")
    result = run_scenario(SCENARIOS["batch_ring"], folder)
    assert not result.timed_out, result.output[-3000:]
    return folder


def test_overlapping_ops_get_lanes_and_p2p_args(tmp_path: Path, batch_ring: Path) -> None:
    """batch_isend_irecv's async ops overlap in time on one rank; each goes to a lane of its own (a
    viewer would otherwise nest one in the other), and p2p ops name their peer."""
    folder = batch_ring
    a, trace = _write(folder, tmp_path / "trace.json")
    _check_structure(trace, a)
    want, _ = _expected_ops(folder, sorted(a.dumps), trace["metadata"]["t0_wall_ns"])
    assert _drawn_ops(trace) == want
    _, threads, _ = _tracks(trace)
    assert any(t >= LANE_STRIDE for (_, t) in threads)
    p2p = [e for e in trace["traceEvents"] if e.get("cat") == "p2p" and e["ph"] == "X"]
    raw = {(r, e["id"]): e for r in a.dumps for e in entries(load_dump(folder, r)) if e["kind"] == "p2p"}
    assert p2p and all(e["args"]["peer"] in {x["peer"] for x in raw.values()} for e in p2p)
    assert {w["rank"] for w in a.report()["waits"]} <= {e["tid"] % LANE_STRIDE for e in trace["traceEvents"]
                                                        if e.get("args", {}).get("waits_for")}


def test_ranks_grouped_per_host(tmp_path: Path) -> None:
    """16 ranks on two hosts (builder dumps, `node0` and `node1`); rank 11 never enters the 3rd all_reduce."""
    job = Job(16)
    job.collective("0")
    job.collective("0")
    job.collective("0", ranks=[r for r in range(16) if r != 11], state="started")
    a, trace = _write(job.write(tmp_path / "dumps"), tmp_path / "trace.json")
    _check_structure(trace, a)
    procs, threads, _ = _tracks(trace)
    assert sorted(procs.values()) == sorted({d.meta["host"] for d in a.dumps.values()}) and len(procs) == 2
    hosts_of = {name: sorted(t for (p, t) in threads if p == pid) for pid, name in procs.items()}
    assert all(len(ranks) == 8 for ranks in hosts_of.values())
    assert threads[next(k for k in threads if k[1] == 11)] == "rank 11 — root cause: not_entered"


def test_last_ops_keeps_each_ranks_newest(tmp_path: Path) -> None:
    """`--trace-last N`: each rank's N newest entries (where a hang is), the older ones counted."""
    a = analyzers.load(str(GOLDEN / "compute_hang"))
    full, last = trace_dict(a), trace_dict(a, last_ops=2)
    _check_structure(last, a)

    def ops(trace: dict[str, Any]) -> dict[int, list[tuple[Any, ...]]]:
        out: dict[int, list[tuple[Any, ...]]] = {}
        for e in sorted((e for e in trace["traceEvents"] if e.get("cat") in ("coll", "p2p") and e["ph"] in ("X", "i")),
                        key=lambda e: e["ts"]):
            out.setdefault(e["tid"], []).append((e["name"], e["args"]["seq"], e["args"]["state"]))
        return out

    assert ops(last) == {r: seqs[-2:] for r, seqs in ops(full).items()}
    assert last["metadata"]["ops"]["older"] == len(a.entries) - 2 * len(a.dumps) and last["metadata"]["last_ops"] == 2
    assert [e for e in last["traceEvents"] if e.get("cat") == "root_cause"] != []
    result = CliRunner().invoke(export_command, [str(GOLDEN / "compute_hang"), "--trace", str(tmp_path / "t.json"),
                                                 "--trace-last", "2"])
    older = last["metadata"]["ops"]["older"]
    assert result.exit_code == 0 and f"{older} older ops left out (--trace-last 2)" in result.stdout


def test_gzip_and_without_orjson(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = analyzers.load(str(GOLDEN / "p2p_deadlock"))
    with_orjson = trace_dict(a)
    write_trace(a, tmp_path / "trace.json.gz")
    with gzip.open(tmp_path / "trace.json.gz", "rt", encoding="utf-8") as fh:
        assert json.load(fh) == with_orjson
    monkeypatch.setattr(trace_events, "_orjson", None)
    assert trace_dict(a) == with_orjson
    assert not list(tmp_path.glob(".*.tmp"))


def test_cli_says_what_it_wrote(tmp_path: Path) -> None:
    trace, out = tmp_path / "t" / "trace.json", tmp_path / "t" / "entries.parquet"
    result = CliRunner().invoke(export_command, [str(GOLDEN / "compute_hang"), "--trace", str(trace), "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("wrote 15 entries to") and out.exists()
    events = len(json.loads(trace.read_text())["traceEvents"])
    assert lines[1].startswith(f"wrote {events} trace events to {trace} (")
    assert "MB): 4 ranks on 1 host, 15 op slices (3 pending at dump time)" in lines[1]
    nothing = CliRunner().invoke(export_command, [str(GOLDEN / "compute_hang")])
    assert nothing.exit_code == 2 and "--trace" in nothing.output and "--out" in nothing.output
    page = tmp_path / "report.html"
    result = CliRunner().invoke(analyze_command, [str(GOLDEN / "compute_hang"), "--html", str(page), "--format", "json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["verdict"] == "hang"
    assert result.stderr.strip().splitlines() == [f"flightrec: wrote the HTML postmortem to {page} "
                                                  f"({page.stat().st_size:,} bytes)"]


# --- a real consumer: Chrome DevTools' trace engine in headless Chromium -----------------------------

PARSE_JS = """
const T = await import('./models/trace/trace.js');
const Model = T.TraceModel && T.TraceModel.Model;
if (!Model || !Model.createWithAllHandlers) return {unsupported: 'no TraceModel.Model.createWithAllHandlers'};
const file = JSON.parse(text);
const model = Model.createWithAllHandlers();
await model.parse(file.traceEvents, {metadata: file.metadata, isFreshRecording: false});
const d = model.parsedTrace().data;
const threads = [];
for (const [pid, proc] of d.Renderer.processes) {
  for (const [tid, th] of proc.threads) {
    threads.push({pid, tid, name: th.name,
                  slices: th.entries.map(e => [e.name, e.ph, Number(e.ts), Number(e.dur), e.cat])});
  }
}
const processes = [...d.Meta.processNames.entries()].map(([pid, e]) => [pid, e.args.name]);
const flows = d.Flows.flows.map(f => f.map(e => [e.pid, e.tid, Number(e.ts)]));
return {threads, processes, flows};
"""


class _DevTools:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4), stdlib only."""

    def __init__(self, tmp: Path, timeout_s: float = 90.0) -> None:
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium is None:
            pytest.skip("chromium is not installed (.ci/test installs it)")
        self.deadline = time.monotonic() + timeout_s
        to_child, self._send = _pipe_high()
        self._recv, from_child = _pipe_high()

        def child_fds() -> None:
            os.dup2(to_child, 3)
            os.dup2(from_child, 4)

        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic",
             "--remote-debugging-pipe", f"--user-data-dir={tmp / 'chromium-profile'}", "about:blank"],
            preexec_fn=child_fds, close_fds=False, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self._buf = b""
        self._id = 0
        target = self.call("Target.createTarget", {"url": "devtools://devtools/bundled/devtools_app.html"})
        self.session = self.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
        while self.evaluate("document.readyState") != "complete":
            time.sleep(0.1)

    def call(self, method: str, params: dict[str, Any], session: str | None = None) -> dict[str, Any]:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params, **({"sessionId": session} if session else {})}
        data = memoryview(json.dumps(message).encode() + b"\0")
        while data:  # 64 KiB at a time, reading what Chromium says meanwhile (else both could block)
            readable, writable, _ = select.select([self._recv], [self._send], [], max(self.deadline - time.monotonic(), 0))
            if readable:
                self._buf += os.read(self._recv, 1 << 20)
            elif not writable:
                raise AssertionError(f"headless Chromium did not read {method} in time")
            if writable:
                data = data[os.write(self._send, data[: 1 << 16]):]
        while True:
            while b"\0" in self._buf:
                line, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(line)
                if reply.get("id") == self._id:
                    assert "error" not in reply, reply
                    return reply["result"]
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self._recv], [], [], left)[0]:
                raise AssertionError(f"headless Chromium did not answer {method} in time")
            chunk = os.read(self._recv, 1 << 20)
            assert chunk, "headless Chromium closed the DevTools pipe"
            self._buf += chunk

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                           self.session)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def parse(self, trace: Path) -> dict[str, Any]:
        """The trace as DevTools' Performance panel model reads it."""
        return self.evaluate(f"(async (text) => {{ {PARSE_JS} }})({json.dumps(trace.read_text(encoding='utf-8'))})")

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        os.close(self._send)
        os.close(self._recv)


def _pipe_high() -> tuple[int, int]:
    """A pipe whose ends are above fd 9, so that moving the child's ends onto 3 and 4 overwrites neither."""
    read, write = os.pipe()
    high = (fcntl.fcntl(read, fcntl.F_DUPFD, 10), fcntl.fcntl(write, fcntl.F_DUPFD, 10))
    os.close(read)
    os.close(write)
    return high


def test_devtools_trace_engine_reads_the_timeline(tmp_path: Path, batch_ring: Path) -> None:
    """Real hangs, a real deadlock and real overlapping p2p ops, loaded by DevTools' own trace model:
    it finds every host, every rank's track by name, every op slice with our times, and the wait
    arrows between ops of one kind."""
    traces = {}
    for name, folder in (("compute_hang", GOLDEN / "compute_hang"), ("p2p_deadlock", GOLDEN / "p2p_deadlock"),
                         ("crash", GOLDEN / "crash"), ("batch_ring", batch_ring)):
        _, trace = _write(folder, tmp_path / f"{name}.json")
        traces[name] = (tmp_path / f"{name}.json", trace)
    devtools = _DevTools(tmp_path)
    try:
        if "unsupported" in (first := devtools.parse(traces["compute_hang"][0])):
            pytest.skip(f"this Chromium's DevTools has no trace model this test knows: {first['unsupported']}")
        seen = {"compute_hang": first} | {n: devtools.parse(p) for n, (p, _) in traces.items() if n != "compute_hang"}
    finally:
        devtools.close()
    for name, (_, trace) in traces.items():
        got = seen[name]
        procs, threads, _ = _tracks(trace)
        assert dict((pid, n) for pid, n in got["processes"]) == procs, name
        ours: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
        for e in trace["traceEvents"]:
            if e["ph"] == "X":
                ours.setdefault((e["pid"], e["tid"]), []).append((e["name"], round(e["ts"], 3), round(e["dur"], 3)))
        theirs = {(t["pid"], t["tid"]): sorted((s[0], round(s[2], 3), round(s[3], 3)) for s in t["slices"] if s[1] == "X")
                  for t in got["threads"]}
        assert {k: sorted(v) for k, v in ours.items()} == {k: v for k, v in theirs.items() if v}, name
        assert all(t["name"] == threads[(t["pid"], t["tid"])] for t in got["threads"]), name
        flows = [e for e in trace["traceEvents"] if e["ph"] == "s"]
        ends = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "f"}
        kinds = {(e["pid"], e["tid"], e["ts"]): e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"}
        same_kind = [f for f in flows if kinds.get((ends[f["id"]]["pid"], ends[f["id"]]["tid"], ends[f["id"]]["ts"])) == f["cat"]]
        assert len(got["flows"]) == len(same_kind), name  # DevTools binds a flow to an event of its category
    assert len(seen["compute_hang"]["flows"]) == len(analyzers.load(str(GOLDEN / "compute_hang")).report()["waits"])
