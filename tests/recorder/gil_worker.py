"""One gloo rank (world size 1) exercising the held-GIL watch (flightrec/watch/gil_watch.py); prints OK at the end.

Run by tests/recorder/test_gil_watch.py in a subprocess with a hard time bound: a deadlock here must
never hang the test run.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import time

import torch.distributed as dist

import flightrec


def hold(seconds: float) -> None:
    """C code that keeps the GIL: the watchdog thread cannot run meanwhile."""
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))


def main() -> None:
    first, second, port = sys.argv[1], sys.argv[2], sys.argv[3]
    original = faulthandler.dump_traceback_later
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo")
    flightrec.enable(dir=first, timeout_s=1.0)  # fires after 3 s without a watchdog tick (the floor)
    time.sleep(0.5)
    path = os.path.join(first, "rank-00000.stacks.txt")
    size = os.path.getsize(path)

    faulthandler.dump_traceback_later(60)  # the job's own timer: flightrec steps aside
    time.sleep(0.5)
    hold(4.0)
    assert os.path.getsize(path) == size, "flightrec re-armed over the job's own faulthandler timer"
    faulthandler.cancel_dump_traceback_later()  # the slot is free again: flightrec takes it back
    time.sleep(0.5)

    pid = os.fork()  # a child that uses faulthandler itself must not deadlock on the parent's timer
    if pid == 0:
        signal.alarm(5)
        faulthandler.dump_traceback_later(60)
        faulthandler.cancel_dump_traceback_later()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0, "a forked child deadlocked in faulthandler"
    hold(4.0)  # right after the fork: re-armed in the parent at once
    text = open(path, encoding="utf-8").read()
    assert "Timeout (" in text and "in hold" in text and "in main" in text, text
    fired = os.path.getsize(path)

    flightrec.disable()
    assert faulthandler.dump_traceback_later is original, "disable() did not give faulthandler back"
    hold(4.0)
    assert os.path.getsize(path) == fired, "the timer outlived disable()"

    flightrec.enable(dir=second, timeout_s=1.0)
    time.sleep(0.5)
    unused = os.path.join(second, "rank-00000.stacks.txt")
    assert os.path.exists(unused)
    flightrec.disable()
    assert not os.path.exists(unused), "a stacks file that never fired was left behind"
    assert os.path.exists(path)  # one that fired is evidence: kept
    dist.destroy_process_group()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
