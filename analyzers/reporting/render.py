"""Human renderings: the short text report, the per-rank entry table, and the DOT wait graph.

Why separate from the analysis: the JSON report is the contract; these are views of it (plus the
graph) and may change wording freely.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import networkx as nx
import pandas as pd

from .. import stackview
from ..constants import COMM_STUCK, CPP_SITE, CRASHED, EXITED, KIND_DEADLOCK, MISMATCH, MISSING_DUMP, NOT_ENTERED
from ..diagnosis.cause_words import headline_words
from ..diagnosis.cause_words import words as cause_words
from ..diagnosis.divergence import line as divergence_line
from ..diagnosis.stalls import short_site
from ..textutil import channel_text, group_text, plural, ranges, rank_text, straggler_cost, straggler_pattern, who
from .todo import cause_step, slow_step

DUMP_REASONS = {  # the dump's `reason`, in words
    "timeout": "its own timeout (an op outlived FLIGHTREC_TIMEOUT)",
    "peer_request": "another rank's request (that rank timed out)",
    "exception": "an uncaught exception",
    "op_failed": "a failed op",
    "signal": "a signal (e.g. SIGTERM from the launcher)",
    "exit": "process exit",
    "manual": "request (flightrec dump-now)",
    "api": "a flightrec.dump() call",
    "abort": "an abort (the process was ending on an error)",
    "snapshot": "a periodic snapshot (FLIGHTREC_SNAPSHOT_S)",
    "recovered": "the recovery of the op its hang dump was for (the job went on)",
}
HANG_VERDICTS = ("hang", "deadlock", "crash", "desync")
DEFAULT_STACK_FRAMES = 5  # frames of a root cause's stack in the default output (-v: all the report keeps)
DEFAULT_WAIT_LINES = 2
DEFAULT_GAP_LINES = 3
DEFAULT_OTHER_CAUSES = 3
GAP_WIDTH = 200


def text_report(report: dict[str, Any], graph: nx.DiGraph | None = None, verbose: bool = False,
                folder: str | None = None) -> str:
    """What happened in plain words on the first line, then labelled detail: the root causes (where to
    act, where each is stuck, its stack as a traceback), where the waiting ranks are, evidence gaps
    grouped, and what to run next. Under ~30 lines at any world size; `verbose` prints everything."""
    lines = [headline(report)]
    lines.append(_evidence_line(report))
    lines += _warnings(report)
    lines += _failure_lines(report.get("failures") or [], verbose, report["ranks"]["missing"])
    lines += _stall_lines(report, verbose)
    causes = [cause_view(c, report) for c in report["root_causes"]]
    if causes:
        shown = causes if verbose else causes[:1]
        for i, c in enumerate(shown):
            lines += [""] + cause_lines(c, report, i, len(causes), verbose)
        rest = causes[len(shown):]
        if rest:
            lines += ["", f"other root causes ({len(rest)}):"]
            lines += [f"  rank {c['rank']}: {_cause_phrase(c)}" for c in rest[:DEFAULT_OTHER_CAUSES]]
            if len(rest) > DEFAULT_OTHER_CAUSES:
                lines.append(f"  ... {len(rest) - DEFAULT_OTHER_CAUSES} more (-v lists them)")
    lines += _divergence_lines(report, verbose)
    chain = _waiting_lines(report, graph, verbose)
    if chain:
        lines += ["", "waiting ranks (waiters -> awaited, where the waiters are):"] + chain
    if report["mismatches"]:
        lines += [""] + _mismatch_lines(report, verbose)
    if report.get("stragglers"):
        top = report["stragglers"] if verbose else report["stragglers"][:3]
        lines += ["", "slow ranks (by what they cost the others, most first):"]
        texts = {str(g["group"]): group_text(g["group"], g.get("desc"), g.get("ranks")) for g in report.get("groups", [])}
        for s in top:
            lines.append(f"  rank {s['rank']}{_on_host(report, s['rank'])}: cost {straggler_cost(s)}, {straggler_pattern(s)}, "
                         f"on {', '.join(channel_text(c, texts) for c in (s.get('channels') or s['groups'])) or '-'}"
                         + (f"; the whole {s['scope']} is slow" if s.get("scope", "rank") != "rank" else ""))
            sites = s.get("late_at") or []
            held = sum(at["count"] for at in sites)
            lines += [f"    late to {_late_site(at)}" + (f" ({at['count']} of the first {held} it held up)" if len(sites) > 1 else "")
                      for at in sites[:None if verbose else 1]]
            if s is top[0]:
                lines.append(f"    next step: {slow_step(s, report)}")
        if len(report["stragglers"]) > len(top):
            lines.append(f"  ... {plural(len(report['stragglers']) - len(top), 'more slow rank')} (-v lists them)")
    if report.get("slow_links") and (verbose or report["verdict"] not in HANG_VERDICTS):  # a hang's are its aftermath
        lines += ["", "slow links:"] + [f"  {k['src']} -> {k['dst']}: {k['transfer_ms_median']:.2f} ms "
                                          f"({k['ratio']:.1f}x the other links)" for k in report["slow_links"][:None if verbose else 3]]
    lines += _gap_lines(report["gaps"], verbose)
    lines += [""] + _next_steps(report, folder, verbose)
    return "\n".join(lines)


DEFAULT_STALL_LINES = 3


def _stall_lines(report: dict[str, Any], verbose: bool) -> list[str]:
    """Stalls that recovered (`recovered_stalls`), one line per position: who held whom, how long, where,
    and whether the timeout dump it caused was a false alarm."""
    stalls = report.get("recovered_stalls") or []
    if not stalls:
        return []
    by_position: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for s in stalls:
        by_position[(s["group"], s["seq"])].append(s)
    out = ["", "stalls that recovered (the job went on):"]
    items = list(by_position.values())
    for part in items if verbose else items[:DEFAULT_STALL_LINES]:
        out.append(f"  {stall_text(part, report)}")
    if len(items) > DEFAULT_STALL_LINES and not verbose:
        out.append(f"  ... {len(items) - DEFAULT_STALL_LINES} more (-v lists them)")
    return out


def stall_text(part: list[dict[str, Any]], report: dict[str, Any]) -> str:
    """`rank 0 held every rank 9.0 s at barrier #11 (train.py:88); the timeout dump was a false alarm:
    FLIGHTREC_TIMEOUT is 5 s` for the holders of one position."""
    s = part[0]
    holders = sorted(x["rank"] for x in part if x["rank"] is not None)
    everyone = set(range(int(report["ranks"]["expected"] or 0)))
    waiters = s.get("waiters") or []
    whom = "every rank" if everyone and set(waiters) | set(holders) == everyone else who(waiters)
    subject = who(holders) if holders else "a rank the dumps cannot name"
    held = max((x["held_s"] for x in part if x.get("held_s") is not None), default=None)
    site = short_site(s.get("site"))
    text = (f"{subject} held {whom}" + (f" {held:.1f} s" if held is not None else "")
            + f" at {s['op']} #{s['seq']}" + (f" of group {s['group']}" if s["group"] != "0" else "")
            + (f" ({site})" if site else ""))
    timeout = s.get("timeout_s")
    if s.get("hang_dump") and timeout is not None:
        return text + f"; the timeout dump was a false alarm: FLIGHTREC_TIMEOUT is {timeout:g} s"
    if timeout is not None and held is not None and held >= timeout:
        return text + f"; longer than FLIGHTREC_TIMEOUT ({timeout:g} s), then it went on"
    return text + "; once, far longer than the group's usual waits, then it went on"


def headline(report: dict[str, Any]) -> str:
    """The first line: what happened, to whom, and who is held up by it, in plain words."""
    verdict = report["verdict"]
    causes = [cause_view(c, report) for c in report["root_causes"]]
    if not causes or verdict not in HANG_VERDICTS:
        return f"{verdict.upper()}: {report['summary'].split(': ', 1)[-1]}"
    c = causes[0]
    direct = _waiters_of(report, c["rank"])
    here = _position(c) if c.get("op") is not None else None
    waiters = next((rs for pos, rs in direct if pos == here), None) or sorted({r for _, rs in direct for r in rs})
    held = len(report.get("victims") or c.get("victims") or [])
    kind, variant, slots = c["kind"], "", {"me": f"rank {c['rank']}"}  # the words: cause_words.CAUSE_WORDS
    if kind == NOT_ENTERED:
        slots["at"] = _position(c)
        if c.get("gil_stacks"):
            at = stackview.where_text(c["gil_stacks"]["at"], None) if c["gil_stacks"].get("at") else "an unknown frame"
            variant, slots["frame"] = "alive", at
    elif kind == MISSING_DUMP:
        slots["at"] = _position(c)
    elif kind == EXITED:
        gone = sorted({f["rank"] for f in report.get("failures") or [] if f["kind"] in ("peer_error", "timeout")}
                      & set(c.get("victims") or []))
        slots["at"] = _position(c)
        if gone:
            what = headline_words(EXITED, "deserted", **slots, failed=who(gone, 40))
            return f"{verdict.upper()}: {what}" + (f" (and {plural(len(causes) - 1, 'more root cause')})" if len(causes) > 1 else "")
    elif kind == CRASHED:
        exc = _exception_text(c)
        slots["exception"] = f" ({exc})" if exc else ""
    elif kind == COMM_STUCK:
        slots.update(group_name=_group_name(c), op_at=_op_at(c), who=who(c["ranks"]))
    elif kind == KIND_DEADLOCK:
        cycle = set(c["ranks"])
        inside = [f"rank {w['rank']} in {_position(_placed(w, report))}" for w in report["waits"] if w["rank"] in cycle]
        what = headline_words(KIND_DEADLOCK, who=who(cycle), inside=", ".join(inside))
        waiters = sorted({w["rank"] for w in report["waits"] if set(w["waits_for"]) & cycle} - cycle)
        more_causes = [x for x in causes[1:] if not (x["kind"] == KIND_DEADLOCK and set(x["ranks"]) == cycle)]
        tail = (f"; {who(waiters, 40)} {'waits' if len(waiters) == 1 else 'wait'} {cause_words(KIND_DEADLOCK).waiters}"
                if waiters else "")
        return f"{verdict.upper()}: {what}{tail}" + (
            f" (and {plural(len(more_causes), 'more root cause')})" if more_causes else "")
    elif kind == MISMATCH and len(c.get("ranks") or [c["rank"]]) > 1:
        variant = "undecided"
        slots.update(who=who(c["ranks"]), at=_position(c))
    else:  # a mismatch with a culprit (and a kind this view does not know)
        kind = MISMATCH
        variant, found = _mismatch_slots(c, report)
        slots.update(found)
    what = headline_words(kind, variant, **slots)
    if kind == CRASHED:
        tail = f"; {plural(held, 'rank')} {cause_words(CRASHED).victims}" if held else ""
    elif waiters:
        tail = f"; {who(waiters, 40)} {'waits' if len(waiters) == 1 else 'wait'} {cause_words(kind).waiters}"
        tail += f" ({held} ranks held up in all)" if held > len(waiters) else ""
    else:
        tail = f"; {plural(held, 'rank')} held up" if held else ""
    more = len(causes) - 1
    return f"{verdict.upper()}: {what}{tail}" + (f" (and {plural(more, 'more root cause')})" if more else "")


SOURCE_PREFIX = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|c|h|hpp|py):\d+\]\s*")  # "[.../pair.cc:553] " of a C++ error


def _failure_lines(failures: list[dict[str, Any]], verbose: bool, missing: list[int]) -> list[str]:
    """Every rank that raised, lost its connection, timed out, was stopped or exited, in the order its
    dump was written: one line per kind (ranks grouped, with the first one's error text), each rank on
    its own line with -v; then the ranks that left no dump. Dump times are when the dump was written,
    not when the op failed."""
    from ..diagnosis.failures import ended_words

    if not failures:
        return []
    gone = ([f"  {who(missing)} left no dump (killed, crashed without a word, or frozen)"] if missing else [])
    times = [f["time_ns"] for f in failures if isinstance(f.get("time_ns"), int)]
    first = min(times) if times else None
    kinds: dict[str, list[dict[str, Any]]] = {}
    for f in failures:
        kinds.setdefault(f["kind"] if not verbose else f"{f['kind']}:{f['rank']}", []).append(f)
    title = "failures" if any(f["kind"] != "exited" for f in failures) else "exits"  # a finished job: no failure
    lines = ["", f"{title} (by when each rank's dump was written):"]
    for fs in kinds.values():
        kind = fs[0]["kind"]
        when = sorted(f["time_ns"] for f in fs if isinstance(f.get("time_ns"), int))
        at = ""
        if when and first is not None:
            lo, hi = (when[0] - first) / 1e9, (when[-1] - first) / 1e9
            at = f" (+{lo:.2f} s)" if hi - lo < 0.005 else f" (+{lo:.2f} to +{hi:.2f} s)"
        text = _error_words(fs[0]["text"]) if kind in ("error", "peer_error", "timeout") else ""
        lines.append(f"  {who([f['rank'] for f in fs])} {ended_words(kind, len(fs))}{at}" + (f": {text}" if text else ""))
    if first is not None:
        import datetime

        stamp = datetime.datetime.fromtimestamp(first / 1e9, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        lines[1] = f"{title} (by when each rank's dump was written, +0 = {stamp} UTC):"
    return lines + gone


def _late_site(at: dict[str, Any]) -> str:
    """`all_reduce at train.py:109`; an op issued from C++ says so."""
    return f"{at['op']} " + (f"at {short_site(at['site'])}" if at.get("site") else CPP_SITE)


def _error_words(text: str, width: int = 110) -> str:
    """An error message as a line: the C++ source location dropped, the first sentence kept."""
    text = SOURCE_PREFIX.sub("", text.splitlines()[0] if text else "")
    cut = text.find(". ", 20)
    text = text[:cut + 1] if cut > 0 else text
    return text if len(text) <= width else text[:width - 3] + "..."


def cause_view(c: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """A root cause with its group's members and description, and the peer of its p2p op (from its own
    wait, or its one waiter's)."""
    c = _placed(c, report)
    if c.get("op") not in P2P_OPS or c.get("peer") is not None:
        return c
    own = next((w for w in report["waits"] if w["rank"] == c["rank"] and w["group"] == c.get("group")
                and w["op"] == c["op"]), None)
    if own is not None and own.get("peer") is not None:
        return {**c, "peer": own["peer"]}
    waiters = [w["rank"] for w in report["waits"] if c["rank"] in w["waits_for"] and w["group"] == c.get("group")
               and w["op"] in P2P_OPS]
    return {**c, "peer": waiters[0]} if len(set(waiters)) == 1 else c


def _placed(item: dict[str, Any], report: dict[str, Any], groups: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """An item of a group with that group's description and members (`group_desc`, `group_ranks`), from
    the report's `groups` (`groups`: those rows by name, when the caller has them)."""
    g = (groups if groups is not None else _group_rows(report)).get(str(item.get("group")))
    if g is None:
        return item
    return {**item, "group_desc": item.get("group_desc") or g.get("desc") or "", "group_ranks": g.get("ranks")}


def _group_rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(g["group"]): g for g in report.get("groups", [])}


def _mismatch_slots(c: dict[str, Any], report: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The headline's variant and slots for a mismatch with a culprit, from the mismatch item at the cause's
    position: `rank 1 called all_gather where its peers called all_reduce, at #4 of group 0`."""
    m = next((m for m in report["mismatches"] if m["group"] == c.get("group") and m["seq"] == c.get("seq")
              and c["rank"] in m["ranks"]), None)
    where = f"#{c.get('seq')} of group {_group_name(c)}"
    if m is None:
        return "", {"where": where}
    mine = next((v for v, rs in m["values"].items() if c["rank"] in rs), "?")
    theirs = " / ".join(v for v in m["values"] if v != mine) or "?"
    if m["field"] == "op":
        return "op", {"where": where, "mine": mine, "theirs": theirs}
    return "field", {"where": where, "mine": mine, "theirs": theirs, "op": m["op"], "field": m["field"]}


def _evidence_line(report: dict[str, Any]) -> str:
    r = report["ranks"]
    job = (report.get("jobs") or {}).get("analysed") or {}
    named = " ".join(part for part in (job.get("launcher"), f'job "{job["job_id"]}"' if job.get("job_id") else None)
                     if part)
    return (f"evidence: {len(r['dumped'])} of {r['expected']} ranks dumped" + (f" ({named})" if named else "")
            + (f"; no dump from {rank_text(r['missing'])}" if r["missing"] else "")
            + (f"; unreadable {rank_text(r['unreadable'])}" if r["unreadable"] else "")
            + (f"; stale {rank_text(r['stale'])}" if r.get("stale") else "") + _age_text(report))


def _age_text(report: dict[str, Any]) -> str:
    """For dumps of a running job (snapshots, dump-now): how old the ranks' states are at the newest dump,
    the oldest rank named, so that a rank seen in an op is not taken for one stuck there now."""
    r = report["ranks"]
    ages = r.get("evidence_age_s") or {}
    if not r.get("running") or not ages:
        return ""
    oldest = max(ages.values())
    ranks = sorted(int(k) for k, v in ages.items() if v == oldest)
    newest = (report.get("jobs") or {}).get("analysed", {}).get("dump_time_ns")
    at = f" ({_clock(newest / 1e9)})" if isinstance(newest, int) else ""
    spread = f"0-{oldest:.1f} s old" if oldest > 0 else "all taken at once"
    return (f"; snapshots of a running job, {spread} at the newest dump{at}"
            + (f", oldest: {who(ranks)}" if oldest > 0 else ""))


def cause_lines(c: dict[str, Any], report: dict[str, Any], i: int, n: int, verbose: bool) -> list[str]:
    """One root cause as labelled lines."""
    title = "root cause" + (f" {i + 1} of {n}" if n > 1 else "")
    out = [f"{title}: rank {c['rank']}{'' if len(c.get('ranks') or []) <= 1 else ' (with ' + who([r for r in c['ranks'] if r != c['rank']]) + ')'}"
           f" — {cause_words(c['kind']).meaning} [{c['kind']}]"]

    def label(name: str, text: str | None) -> None:
        if text:
            out.append(f"  {name:<11} {text}")

    label("where", _host_text(c))
    if c.get("op") is not None:
        label("position", _position(c))
    waiters = _waiters_of(report, c["rank"])
    if c.get("op") is not None:  # those in its own position first: the rest wait behind them
        waiters.sort(key=lambda kv: kv[0] != _position(c))
    if waiters:
        label("waited by", "; ".join(f"{who(rs)} in {pos}"
                                     for pos, rs in waiters[: None if verbose else 2])
              + (f"; {plural(len(waiters) - 2, 'more position')}" if not verbose and len(waiters) > 2 else ""))
    if c.get("gil_stacks"):
        held = c["gil_stacks"]
        label("alive", f"holding the GIL, not answering: no dump (its watchdog thread could not run); faulthandler "
                       f"wrote its stacks to {held['file']} at {_clock(held['written_unix_s'])} (the file's write time)")
    if c["kind"] in (NOT_ENTERED, EXITED):
        label("now at", _now_at(c))
        label("last op", PATH_PREFIX.sub(r"\1", c.get("last_op") or "") or None)
    else:
        label("why", c["detail"] if verbose or len(c["detail"]) <= 300 else c["detail"][:297] + "...")
        label("call site", c.get("site") if c["kind"] != CRASHED else None)
    label("next step", cause_step(c))
    out += _thread_lines(c, verbose)
    if c.get("dump_reason") and verbose:  # how the evidence came: not what to act on
        why = DUMP_REASONS.get(c["dump_reason"].split(":")[0], c["dump_reason"])
        label("dump", f"written on {why}" + (f" ({c['dump_reason_detail']})" if c.get("dump_reason_detail") and verbose else ""))
    stack, source = list(c.get("stack") or []), list(c.get("source") or [])
    if stack:
        if not verbose:
            stack, source = stackview.excerpt(stack, source, limit=DEFAULT_STACK_FRAMES, outer=1, user_only=True)
        kind = "traceback of its error" if c["kind"] == CRASHED else "main thread's stack"
        out.append(f"  {kind} (most recent call last):")
        out += stackview.traceback_lines(stack, source, indent="    ")
    elif c["kind"] == EXITED:
        out.append("  (it exited: its exit record holds no thread stacks; its last op above is where it left)")
    elif c["kind"] in (NOT_ENTERED, MISSING_DUMP):
        out.append("  (no thread stacks in its dump: where it is stuck is unknown)")
    return out


DEFAULT_THREAD_LINES = 2


def _thread_lines(c: dict[str, Any], verbose: bool) -> list[str]:
    """The rank's other busy threads (`threads`): on the first screen when its main thread waits on a
    lock, a queue or a join (the thread holding it is the one to look at), with their stacks in -v."""
    threads = c.get("threads") or []
    if not threads or not (verbose or c.get("main_waits_on_thread")):
        return []
    out = []
    for i, t in enumerate(threads if verbose else threads[:DEFAULT_THREAD_LINES]):
        name = "thread" if i == 0 else ""
        out.append(f"  {name:<11} {t['name']} at {stackview.where_text(t['at'], t.get('code'))}")
        if verbose:
            out += stackview.traceback_lines(t.get("stack") or [], t.get("source"), indent="      ")
    if len(threads) > len(out) and not verbose:
        out.append(f"  {'':<11} ... {plural(len(threads) - DEFAULT_THREAD_LINES, 'more thread')} (-v lists them)")
    return out


def _cause_phrase(c: dict[str, Any]) -> str:
    at = f" at {_position(c)}" if c.get("op") is not None else ""
    return f"{cause_words(c['kind']).meaning}{at} [{c['kind']}]" + (f" on host {c['host']}" if c.get("host") else "")


def _now_at(c: dict[str, Any]) -> str | None:
    """Where the rank's main thread is: the innermost frame of the user's code (library frames are in
    its stack, below), else its innermost frame."""
    stack, source = list(c.get("stack") or []), list(c.get("source") or [])
    user = stackview.innermost_user(stack, source)
    if user is not None:
        return stackview.where_text(*user) + " (main thread)"
    if not c.get("site"):
        return None
    code = source[-1] if source and (stack or [None])[-1] == c["site"] else None
    return stackview.where_text(c["site"], code) + " (main thread)"


def _clock(unix_s: float) -> str:
    """A wall-clock time, UTC, to the millisecond."""
    import datetime

    return datetime.datetime.fromtimestamp(unix_s, datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-3] + " UTC"


def _host_text(c: dict[str, Any]) -> str | None:
    """`host vm (node 0, local rank 3, pid 77)`; a host inferred from a peer's dump says so and why; an
    unknown one says why (diagnosis/hosts.py). None for a report without places (an older schema)."""
    if not c.get("host"):
        return f"host unknown ({c['host_detail']})" if c.get("host_detail") else None
    parts = [f"node {c['node_rank']}" if c.get("node_rank") is not None else None,
             f"local rank {c['local_rank']}" if c.get("local_rank") is not None else None,
             f"pid {c['pid']}" if c.get("pid") is not None else None]
    extra = ", ".join(p for p in parts if p)
    inferred = f"; inferred: {c['host_detail']}" if c.get("host_from") == "peers" and c.get("host_detail") else ""
    return f"host {c['host']}" + (f" ({extra}{inferred})" if extra or inferred else "")


def _on_host(report: dict[str, Any], rank: int) -> str:
    """` (host vm)` for a rank the report places; ` (host unknown)` for one it names but cannot place."""
    place = (report.get("hosts") or {}).get(str(rank))
    if place is None:
        return ""
    return f" (host {place['host']}" + (", inferred" if place.get("host_from") == "peers" else "") + ")" \
        if place.get("host") else " (host unknown)"


def _exception_text(c: dict[str, Any]) -> str | None:
    detail = c.get("detail") or ""
    for marker in (": uncaught in thread ", "raised "):
        if marker in detail:
            return detail.split(marker, 1)[1].split(";")[0][:120]
    return None


def _group_name(c: dict[str, Any]) -> str:
    """`4 [1, 3] (dp)`: the group's name, members and what it is (textutil.group_text)."""
    return group_text(c.get("group"), c.get("group_desc"), c.get("group_ranks"))


def _op_at(c: dict[str, Any]) -> str:
    if c.get("op") in P2P_OPS:  # its per-pair number is an internal count: the peer says more
        peer = c.get("peer")
        return str(c.get("op")) + (f" {'to' if 'send' in str(c['op']) else 'from'} rank {peer}" if peer is not None and peer >= 0 else "")
    if c.get("op") == "unknown":  # issued from C++ where no recorder said what (torch before 2.5 on gloo)
        return f"collective #{c.get('seq')} (issued from C++, op not recorded)"
    return f"{c.get('op')} #{c.get('seq')}"


def _position(c: dict[str, Any]) -> str:
    """`all_reduce #9 of group 0 [0-3] (world)`; p2p ops without their per-pair number (an internal count)."""
    return f"{_op_at(c)} of group {_group_name(c)}"


PATH_PREFIX = re.compile(r"(?<= at )[^ ]*[/\\]([^/\\ ]+:\d+ in )")  # `at /a/b/train.py:9 in` -> `at train.py:9 in`
P2P_OPS = ("send", "recv", "isend", "irecv", "batch_isend_irecv")


def _waiters_of(report: dict[str, Any], rank: int) -> list[tuple[str, list[int]]]:
    """Who waits for `rank` directly, per position."""
    groups = _group_rows(report)
    rows: dict[str, list[int]] = defaultdict(list)
    for w in report["waits"]:
        if rank in w["waits_for"]:
            rows[_position(_placed(w, report, groups))].append(w["rank"])
    return sorted(rows.items(), key=lambda kv: -len(kv[1]))


def _mismatch_lines(report: dict[str, Any], verbose: bool) -> list[str]:
    shown = report["mismatches"] if verbose else report["mismatches"][:3]
    out = [f"mismatches ({len(report['mismatches'])}):"]
    for m in shown:
        vals = "; ".join(f"{v!s} on {rank_text(rs, 40)}" for v, rs in m["values"].items())
        out.append(f"  {m['op']} #{m['seq']} of group {_group_name(_placed(m, report))}: {m['field']} differs on {who(m['ranks'], 40)} ({vals})")
    if len(report["mismatches"]) > len(shown):
        out.append(f"  ... {len(report['mismatches']) - len(shown)} more (-v or --format json lists all)")
    return out


def _divergence_lines(report: dict[str, Any], verbose: bool) -> list[str]:
    """Where ranks' op streams went another way: per call site, a rank's count next to its peers'."""
    items = report.get("divergence") or []
    if not items:
        return []
    shown = items if verbose else items[:3]
    out = ["", "where the op streams diverged (collectives issued per call site):"]
    out += [f"  {divergence_line(d, short=True)}" for d in shown]
    if len(items) > len(shown):
        out.append(f"  ... {len(items) - len(shown)} more (-v or --format json lists all)")
    return out


def _gap_lines(gaps: list[str], verbose: bool) -> list[str]:
    """Evidence gaps, those that differ only in their rank and numbers told once with the ranks."""
    grouped = group_gaps(gaps)
    if not grouped:
        return []
    shown = grouped if verbose else grouped[:DEFAULT_GAP_LINES]
    out = ["", f"evidence gaps ({len(grouped)}):"]
    for text in shown:
        text = text if verbose else _short_rank_prefix(text)
        out.append(f"  - {text if verbose or len(text) <= GAP_WIDTH else text[:GAP_WIDTH - 3] + '...'}")
    if len(grouped) > len(shown):
        out.append(f"  ... {len(grouped) - len(shown)} more (-v prints every gap in full)")
    return out


RANKS_PREFIX = re.compile(r"^ranks ((?:\d+(?:-\d+)?, )*\d+(?:-\d+)?): ")


def _short_rank_prefix(text: str) -> str:
    """A gap's leading `ranks 8-23, 40-55, ...:` list cut to one readable phrase."""
    m = RANKS_PREFIX.match(text)
    if not m or len(m.group(1)) <= 72:
        return text
    ranks = [r for part in m.group(1).split(", ") for r in _span(part)]
    return f"{who(ranks)}: {text[m.end():]}"


def _span(part: str) -> range:
    a, _, b = part.partition("-")
    return range(int(a), int(b or a) + 1)


RANK_PREFIX = re.compile(r"^rank (\d+): (.*)$", re.S)
NUMBER = re.compile(r"\d+")


def group_gaps(gaps: list[str]) -> list[str]:
    """`rank 3: X` and `rank 7: X'` where X and X' differ only in numbers become one line naming both ranks
    (the first rank's figures shown)."""
    order: list[str] = []
    ranks: dict[str, list[int]] = defaultdict(list)
    text: dict[str, str] = {}
    for g in gaps:
        m = RANK_PREFIX.match(g)
        key = NUMBER.sub("#", m.group(2)) if m else g
        if key not in text:
            order.append(key)
            text[key] = m.group(2) if m else g
        if m:
            ranks[key].append(int(m.group(1)))
    out = []
    for key in order:
        rs = ranks.get(key)
        if not rs:
            out.append(text[key])
        elif len(rs) == 1:
            out.append(f"rank {rs[0]}: {text[key]}")
        else:
            out.append(f"ranks {rank_text(rs)}: {text[key]} (figures of rank {rs[0]}; -v for each)")
    return out


def _next_steps(report: dict[str, Any], folder: str | None, verbose: bool) -> list[str]:
    """What to run next, with this folder filled in."""
    folders = report.get("folders") or [folder or report.get("folder") or "DIR"]
    where = " ".join(map(str, folders))
    usable = set(report["ranks"]["dumped"]) - set(report["ranks"].get("stale") or [])
    named = [r for c in report["root_causes"] for r in c.get("ranks") or [c["rank"]]]
    named += [s["rank"] for s in report.get("stragglers") or []]
    culprit = next((r for r in named if r in usable), None)  # `show` fails for a rank without a dump
    first = ([] if verbose else [f"flightrec analyze {where} -v"]) + [f"flightrec analyze {where} --html report.html"]
    second = ([f"flightrec show {where} --rank {culprit}"] if culprit is not None else []) + [
        f"flightrec export {where} --trace trace.json"] + ([f"flightrec notebook {where}"] if len(folders) == 1 else [])
    return ["next:  " + "   ".join(first), "       " + "   ".join(second)]


def _warnings(report: dict[str, Any]) -> list[str]:
    """Evidence that changes what the verdict is about, stated before it is read: other jobs' dumps set
    aside, stale dumps taken as unknown (the details are in the gaps), other restart attempts' dumps."""
    out = []
    for job in (report.get("jobs") or {}).get("ignored", []):
        name = f'job "{job["job_id"]}"' if job.get("job_id") else "another job"
        out.append(f"warning: this folder also holds dumps of {name} (world size {job.get('world_size') or '?'}): "
                   f"rank(s) {ranges(job['ranks'])} ignored; only the newest job is analysed (see gaps)")
    stale = report["ranks"].get("stale")
    if stale:
        out.append(f"warning: the dump(s) of rank(s) {ranges(stale)} are stale (much older than the others'): "
                   "taken as no current state (see gaps)")
    attempts = report.get("attempts") or {}
    if attempts.get("others"):
        others = "; ".join(f"attempt {o['attempt']}: rank(s) {ranges(o['ranks'])}" for o in attempts["others"])
        out.append(f"warning: dumps of other torchelastic restart attempts are here too ({others}); "
                   f"this report is of attempt {attempts['analysed']} (--attempt N analyses another)")
    return out


def _waiting_lines(report: dict[str, Any], graph: nx.DiGraph | None, verbose: bool) -> list[str]:
    """Waits grouped by (position, awaited ranks, where the waiters' program is): narrow groups first
    (where stalls start), then nearest to a root cause."""
    waits = [w for w in report["waits"] if w["waits_for"]]
    if not waits:
        return []
    depth: dict[int, int] = {}
    if graph is not None:
        roots = {r for c in report["root_causes"] for r in c["ranks"]}
        rev = graph.reverse(copy=False)
        for root in roots:
            if root in rev:
                for node, d in nx.single_source_shortest_path_length(rev, root).items():
                    depth[node] = min(depth.get(node, d), d)
    groups = _group_rows(report)
    rows: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for w in waits:
        seq = None if w["op"] in P2P_OPS else w["seq"]  # a transfer's per-pair number is not shown: one line per peer
        rows[(w["group"], seq, w["op"], tuple(w["waits_for"]), _waiter_where(w))].append(w["rank"])
    size = {g["group"]: len(g["ranks"]) for g in report.get("groups", [])}
    ordered = sorted(
        rows.items(),
        key=lambda kv: (size.get(kv[0][0], 1 << 20), min(depth.get(r, 1 << 20) for r in kv[1]), kv[0][0],
                        -1 if kv[0][1] is None else kv[0][1]),
    )
    limit = len(ordered) if verbose else DEFAULT_WAIT_LINES
    out = []
    for (group, seq, op, awaited, where), waiters in ordered[:limit]:
        peer = awaited[0] if op in P2P_OPS and len(awaited) == 1 else None
        position = _position(_placed({"group": group, "seq": seq, "op": op, "peer": peer}, report, groups))
        at = where if where == CPP_SITE else f"at {where}"  # "issued from C++ (...)" reads without "at"
        out.append(f"  {who(waiters, 40)} -> {who(awaited, 24)} in {position}" + (f", {at}" if where else ""))
    if len(ordered) > limit:
        rest = sorted({r for _, rs in ordered[limit:] for r in rs})
        out.append(f"  ... {plural(len(rest), 'more rank')} wait in {plural(len(ordered) - limit, 'more position')}, "
                   "most behind the ones above (-v lists them)")
    return out


def _waiter_where(w: dict[str, Any]) -> str | None:
    """Where a waiting rank's program is: its own code's innermost frame (the line that called into the
    library, e.g. `loss.backward()`), else the op's call site."""
    if w.get("where"):
        return stackview.where_text(w["where"], w.get("where_code"))
    site = w.get("site")
    return stackview.where_text(site, None) if isinstance(site, str) and stackview.is_user_frame(site) else None


def entry_table(entries: pd.DataFrame, rank: int, group: str | None = None, wall_offset_ns: int | None = None) -> str:
    """A rank's entries as a fixed-width table (the `show` command): when each op was issued (UTC wall
    clock, to the ms) and how long it took, as measured; blank where the dump has no such measurement
    (a time only polled, an op still pending), never a placeholder number."""
    rows = entries.loc[entries["rank"] == rank]
    if group is not None:
        rows = rows.loc[rows["group"] == group]
    if rows.empty:
        return f"rank {rank}: no entries" + (f" in group {group}" if group is not None else "")
    start = rows["t_enqueue_ns"].astype("Int64")
    end = rows["t_complete_ns"].astype("Int64")
    took = ((end - start) / 1e6).where(end.notna() & start.notna() & (end >= start))
    offset = 0 if wall_offset_ns is None else int(wall_offset_ns)
    wall = pd.to_datetime((start + offset).astype("float64"), unit="ns", utc=True, errors="coerce")
    view = pd.DataFrame({
        "id": rows["id"].to_numpy(),
        "group": rows["group"].astype(str).to_numpy(),
        "seq": _blank_below(rows["seq"], 1),
        "kind": rows["kind"].astype(str).to_numpy(),
        "op": rows["op"].astype(str).to_numpy(),
        "peer": _blank_below(rows["peer"], 0),
        "state": rows["state"].astype(str).to_numpy(),
        "start (UTC)": wall.dt.strftime("%H:%M:%S.%f").str[:-3].fillna("").to_numpy() if wall_offset_ns is not None
        else [""] * len(rows),
        "ms": [f"{v:.3f}" if v == v else "" for v in took.astype("float64").to_numpy()],
        "in_shapes": _text(rows["in_shapes"]),
        "out_shapes": _text(rows["out_shapes"]),
        "dtypes": _text(rows["in_dtypes"]),
        "reduce_op": _text(rows["reduce_op"]),
        "site": [_site_text(v, src) for v, src in zip(rows["site"].to_numpy(), rows["source"].astype(str).to_numpy(), strict=True)],
    })
    return view.to_string(index=False)


def _blank_below(column: pd.Series, low: int) -> list[str]:
    """Ids as text, blank where the column says "none" (seq 0, peer -1)."""
    values = column.to_numpy()
    return [str(int(v)) if v == v and int(v) >= low else "" for v in values]


def _text(column: pd.Series) -> list[str]:
    return ["" if v is None or (isinstance(v, float) and v != v) else str(v) for v in column.astype(object).to_numpy()]


def _site_text(site: object, source: str) -> str:
    if isinstance(site, str) and site:
        return stackview.where_text(site, None)
    return "C++ (e.g. DDP's Reducer)" if source == "c++" else ""


def to_dot(graph: nx.DiGraph, report: dict[str, Any]) -> str:
    """The wait-for graph in Graphviz DOT: root causes red, ranks without a dump dashed."""
    kinds = {r: c["kind"] for c in report["root_causes"] for r in c["ranks"]}
    lines = ["digraph waits {", "  rankdir=LR;", '  node [shape=box, fontname="monospace"];']
    for n, attrs in sorted(graph.nodes(data=True)):
        label = f"rank {n}\\n{kinds.get(n, attrs.get('status', ''))}"
        style = []
        if n in kinds:
            style.append('color=red, fontcolor=red, penwidth=2')
        if not attrs.get("dumped"):
            style.append("style=dashed")
        lines.append(f'  {n} [label="{label}"{", " + ", ".join(style) if style else ""}];')
    for u, v, attrs in sorted(graph.edges(data=True)):
        label = f"{attrs.get('op')} g{attrs.get('group')} #{attrs.get('seq')}\\n{attrs.get('reason')}"
        lines.append(f'  {u} -> {v} [label="{_esc(label)}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _esc(text: str) -> str:
    return text.replace('"', '\\"')
