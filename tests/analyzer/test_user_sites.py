"""Code locations in the user's code: a dump whose recorder placed ops at a library frame (FSDP2's hooks
under torch's no_grad decorator, `torch/utils/_contextlib.py:124`) is read with each such op placed at
the innermost frame of the user's code of a stack that holds it: the entry's own stack, or the thread's
that is inside the op now. The "at", "now at" and `show` lines name the user's file, never torch's."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from analyzers.cli import analyze_command, show_command
from fixtures.builders import Job
from flightrec.format.libraries import is_library_file

LIBRARY_SITE = "/venv/lib/python3.11/site-packages/torch/utils/_contextlib.py:124 in decorate_context"
TORCH_FRAMES = ["/venv/lib/python3.11/site-packages/torch/nn/modules/module.py:1750 in _call_impl",
                "/venv/lib/python3.11/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_state.py:230 in _pre_forward",
                "/venv/lib/python3.11/site-packages/torch/utils/_contextlib.py:124 in decorate_context",
                "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3800 in all_gather_into_tensor"]
USER = ["/home/me/train.py:140 in <module>", "/home/me/train.py:120 in main", "/home/me/train.py:96 in step"]


def _old_fsdp_dump(folder: Path) -> Path:
    """Rank 0 stalls in compute after an op recorded with its own stack; rank 1 waits in an all_gather
    whose main thread is inside it (an op the C hot path does not name: in_op -1)."""
    job = Job(2)
    for _ in range(2):
        job.collective("0", "all_gather_into_tensor", site=LIBRARY_SITE)
    job.collective("0", "reduce_scatter_tensor", site=LIBRARY_SITE, ranks=[0],
                   stack=[*USER[:2], "/home/me/train.py:99 in step", *TORCH_FRAMES])
    job.collective("0", "reduce_scatter_tensor", site=LIBRARY_SITE, ranks=[1])
    job.collective("0", "all_gather_into_tensor", ranks=[1], state="started", site=LIBRARY_SITE)
    job.stack(0, [*USER[:2], "/home/me/train.py:90 in step", "/home/me/data.py:41 in decode_shard"])
    job.stack(1, [*USER, *TORCH_FRAMES], in_op=-1)
    return job.write(folder)


def test_library_sites_of_an_old_dump_read_as_the_users_line(tmp_path: Path) -> None:
    folder = _old_fsdp_dump(tmp_path / "job")
    out = CliRunner().invoke(analyze_command, [str(folder), "-q"]).output
    assert "_contextlib" not in out.split("next:")[0], out
    assert "last op     reduce_scatter_tensor (group 0 [0-1] (world), seq 3, completed) at train.py:99 in step" in out, out
    assert "now at      data.py:41 in decode_shard (main thread)" in out, out
    assert "rank 1 -> rank 0 in all_gather_into_tensor #4 of group 0 [0-1] (world), at train.py:96 in step" in out, out
    shown = CliRunner().invoke(show_command, [str(folder), "--rank", "1"]).output
    assert shown.splitlines()[-1].endswith("train.py:96 in step"), shown
    # an op with no stack that holds it keeps the site it was recorded at
    assert "_contextlib.py:124 in decorate_context" in shown.splitlines()[1], shown


def test_now_at_skips_library_frames_to_the_users_line(tmp_path: Path) -> None:
    """A rank stuck inside a library (a data loader's queue): "now at" is the user's line that called it."""
    job = Job(2)
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce", ranks=[1], state="started")
    job.stack(0, [*USER, "/usr/lib/python3.11/queue.py:171 in get", "/usr/lib/python3.11/threading.py:327 in wait"])
    out = CliRunner().invoke(analyze_command, [str(job.write(tmp_path / "job")), "-q"]).output
    assert "now at      train.py:96 in step (main thread)" in out, out


def test_one_definition_of_library_code() -> None:
    for path in ("/x/site-packages/torch/utils/_contextlib.py", "/src/pytorch/torch/nn/modules/module.py",
                 "/ws/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", "/usr/lib/python3.11/threading.py",
                 "<frozen runpy>", "/opt/deepspeed/runtime/engine.py", "/y/dist-packages/accelerate/accelerator.py"):
        assert is_library_file(path), path
    for path in ("/home/me/train.py", "/work/fixtures/jobs/scenarios.py", "<string>", "/home/me/torchrun_job.py"):
        assert not is_library_file(path), path


CHECKPOINT = ["/usr/lib/python3.11/threading.py:1002 in _bootstrap", "/usr/lib/python3.11/threading.py:1045 in run",
              "/home/me/ckpt.py:30 in save", "/home/me/ckpt.py:41 in serialize"]


def _lock_wait(folder: Path) -> Path:
    """Rank 0's main thread waits on a lock its checkpoint thread holds (a C lock: no Python frame,
    its own line `with CKPT_LOCK:`); rank 1 waits for it in an all_reduce. Idle threads beside them."""
    job = Job(2)
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce", ranks=[1], state="started")
    job.stack(0, [*USER[:2], "/home/me/train.py:77 in step"])
    job.threads[0][0]["code"] = ["main()", "step()", "with CKPT_LOCK:"]
    job.threads[0] += [
        {"name": "checkpoint", "ident": 7, "daemon": True, "is_main": False, "stack": CHECKPOINT,
         "code": [None, None, "serialize(state)", "time.sleep(0.5)"]},
        {"name": "ThreadPoolExecutor-0_0", "ident": 8, "daemon": True, "is_main": False,
         "stack": ["/usr/lib/python3.11/threading.py:1002 in _bootstrap",
                   "/usr/lib/python3.11/concurrent/futures/thread.py:81 in _worker",
                   "/usr/lib/python3.11/queue.py:171 in get", "/usr/lib/python3.11/threading.py:327 in wait"]},
    ]
    return job.write(folder)


def test_a_thread_holding_the_main_thread_is_named(tmp_path: Path) -> None:
    """The checkpoint thread is on the first screen (the main thread waits on a lock), with its stack in
    -v and in the JSON; the recorder's watchdog and an idle pool worker are left out."""
    import json

    folder = _lock_wait(tmp_path / "job")
    out = CliRunner().invoke(analyze_command, [str(folder), "-q"]).output
    first = out.split("next:")[0]
    assert "  thread      checkpoint at ckpt.py:41 in serialize: time.sleep(0.5)" in first, out
    assert "watchdog" not in first and "ThreadPoolExecutor" not in first, out
    verbose = CliRunner().invoke(analyze_command, [str(folder), "-q", "-v"]).output
    assert 'File "/home/me/ckpt.py", line 30, in save' in verbose, verbose
    report = json.loads(CliRunner().invoke(analyze_command, [str(folder), "-q", "--format", "json"]).output)
    cause = report["root_causes"][0]
    assert cause["main_waits_on_thread"] is True
    assert [(t["name"], t["at"]) for t in cause["threads"]] == [("checkpoint", "/home/me/ckpt.py:41 in serialize")]
    assert cause["threads"][0]["stack"][-1] == CHECKPOINT[-1]


def test_busy_threads_stay_off_the_first_screen_unless_the_main_thread_waits(tmp_path: Path) -> None:
    job = Job(2)
    job.collective("0", "all_reduce")
    job.collective("0", "all_reduce", ranks=[1], state="started")
    job.stack(0, [*USER, "/home/me/data.py:41 in decode_shard"])
    job.threads[0].append({"name": "checkpoint", "ident": 7, "daemon": True, "is_main": False, "stack": CHECKPOINT})
    folder = job.write(tmp_path / "job")
    assert "checkpoint" not in CliRunner().invoke(analyze_command, [str(folder), "-q"]).output.split("next:")[0]
    assert "checkpoint at ckpt.py:41 in serialize" in CliRunner().invoke(analyze_command, [str(folder), "-q", "-v"]).output
