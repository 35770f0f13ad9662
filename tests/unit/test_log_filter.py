"""What of a job's log reaches the terminal (issue 17): lines as Ray 2.60 writes them into a job's log."""
import io

from rich.console import Console

from raytrain.log_filter import LogFilter, wants_color
from raytrain.cli.progress import ProgressPrinter, memory_summary
from raytrain.events import JobFacts

E = "\x1b"
TB = [
    f"{E}[36m(TrainController pid=22975){E}[0m Traceback (most recent call last):",
    f'{E}[36m(TrainController pid=22975){E}[0m   File "/x/ray/_private/worker.py", line 3009, in get',
    f"{E}[36m(TrainController pid=22975){E}[0m     values = worker.get_objects(",
    f"{E}[36m(TrainController pid=22975){E}[0m            ^^^^^^^^^^^^^^^^^^^",
    f"{E}[36m(TrainController pid=22975){E}[0m ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.",
]
LOG = [
    "2026-12-03 13:08:13,328\tINFO job_manager.py:581 -- Runtime env is setting up.",
    "Running entrypoint for job raytrain-gpt-zero-20261203-130750-4b8e53: python -m raytrain.runtime.driver.entrypoint",
    "2026-12-03 13:08:24,091 INFO worker.py:1841 -- Connecting to existing Ray cluster at address: 1.2.3.4:6422...",
    f"2026-12-03 13:08:24,192 INFO worker.py:2029 -- Connected to Ray cluster. View the dashboard at {E}[1m{E}[32m"
    f"http://127.0.0.1:8322 {E}[39m{E}[22m",
    f"{E}[36m(TrainController pid=22975){E}[0m Failed to send resource request for train-4870d11a. If this only "
    "happens transiently during network partition or CPU being overloaded, it's safe to ignore this error.",
    *TB,
    f"{E}[33m(raylet){E}[0m [2026-12-03 13:09:01,123 E 123 456] core_worker.cc:2210: Actor PreemptionWatcher was "
    "killed with max_restarts > 0; it will not be restarted",
    "(raylet) A worker died or was killed while executing a task by an unexpected system error. To troubleshoot",
    "(TrainController pid=23546) Graceful shutdown of backend failed. This is expected if one of the workers has crashed.",
    "(TrainController pid=23546) Traceback (most recent call last):",
    "(TrainController pid=23546) ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
    "(TrainController pid=23546)     class_name: RayTrainWorker",
    "(TrainController pid=23546) The actor is dead because its worker process has died.",
    '(TrainController pid=23546) @@raytrain {"event":"restarting","attempt":2}',
    f"{E}[36m(RayTrainWorker pid=23378){E}[0m GPT: 0.12M parameters",
    f"{E}[36m(RayTrainWorker pid=23378){E}[0m Traceback (most recent call last):",  # the user's own: kept
    '(RayTrainWorker pid=23378) @@raytrain {"event":"metrics","step":1,"loss":5.0}',
    "(RayTrainWorker pid=23378) Reporting training result 1: ...",
    "(RayTrainWorker pid=23378) [2026-12-06 18:03:11,201] [WARNING] [engine.py:2304:_do_optimizer_sanity_check] "
    "**** You are using ZeRO with an untested optimizer, proceed with caution *****",
]


def shown(lines, **kw):
    keep = LogFilter(**kw)
    return [out for out in map(keep, lines) if out is not None]


def test_ray_chatter_and_internal_warnings_are_dropped_and_ansi_stripped():
    out = shown(LOG, color=False)
    assert out == [
        '(TrainController pid=23546) @@raytrain {"event":"restarting","attempt":2}',
        "(RayTrainWorker pid=23378) GPT: 0.12M parameters",
        "(RayTrainWorker pid=23378) Traceback (most recent call last):",
        '(RayTrainWorker pid=23378) @@raytrain {"event":"metrics","step":1,"loss":5.0}',
    ]


def test_verbose_shows_everything_still_without_ansi_off_a_terminal():
    out = shown(LOG, color=False, verbose=True)
    assert len(out) == len(LOG) and not any(E in line for line in out)
    assert any("PreemptionWatcher" in line for line in out)


def test_color_only_on_a_terminal_and_never_with_no_color(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert wants_color(True) and not wants_color(False)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not wants_color(True)


def test_progress_printer_piped_output_is_clean():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=200)
    with ProgressPrinter(console) as printer:
        printer.on_text("\n".join(LOG) + "\n")
    text = buf.getvalue()
    assert E not in text and " INFO " not in text and "PreemptionWatcher" not in text
    assert "GPT: 0.12M parameters" in text and "step 1  loss 5.0000" in text


def test_memory_lines_say_per_gpu_only_for_gpu_workers():
    estimate = {"event": "estimate", "gpu_total": 3e9, "gpu_allocated": 7e8, "model_states": 5e8, "params": 1000}
    cpu = JobFacts(memory={0: {"rss_peak": 6e8}}, estimate=estimate)
    # a CPU worker: the training state the planner counts, not the GPU total (CUDA context, allocator reserve)
    assert "planner estimate per worker: 0.70 GB of training state" in memory_summary(cpu)[1], memory_summary(cpu)
    gpu = JobFacts(memory={0: {"gpu_memory_peak": 6e8}}, estimate=estimate)
    assert "planner estimate per GPU: 3.00 GB" in memory_summary(gpu)[1], memory_summary(gpu)
    tiny = JobFacts(memory={0: {"rss_peak": 6e8}},
                    estimate={"event": "estimate", "gpu_total": 2e9, "gpu_allocated": 2_370_560, "model_states": 1_896_448,
                              "params": 118_528})
    assert "per worker: 2.4 MB of training state (model states 1.9 MB" in memory_summary(tiny)[1], memory_summary(tiny)


def test_the_estimate_line_says_how_many_parameters_train_when_some_are_frozen():
    frozen = {"event": "estimate", "gpu_total": 1e9, "model_states": 5e8, "params": 1000, "trainable": 40}
    line = memory_summary(JobFacts(memory={0: {"rss_peak": 6e8}}, estimate=frozen))[1]
    assert "1,000 parameters, 40 trainable;" in line
    every = {**frozen, "trainable": 1000}
    assert "trainable" not in memory_summary(JobFacts(memory={0: {"rss_peak": 6e8}}, estimate=every))[1]


def test_raytrains_own_lines_are_never_wrapped_in_a_pipe():
    """A pipe's console is 80 columns wide: raytrain's long lines (a restart's reason, the training line) stay
    one line each, so a log file greps as the terminal showed it."""
    from raytrain import events

    buf = io.StringIO()
    reason = ("rank 1: its worker process died (SYSTEM_ERROR: Worker unexpectedly exits with a connection error "
              "code 2. End of file.)")
    with ProgressPrinter(Console(file=buf, force_terminal=False, width=80)) as printer:
        printer.on_text(events.format_event(events.STARTED, name="a-rather-long-job-name-for-this-test", workers=2,
                                            zero=3, precision="bf16", train_batch=1024) + "\n"
                        + events.format_event(events.RESTARTING, attempt=2, rank=1, reason=reason) + "\n")
    lines = buf.getvalue().splitlines()
    assert f"raytrain: workers restarting: {reason}" in lines, lines
    assert ("raytrain: training a-rather-long-job-name-for-this-test on 2 worker(s), ZeRO-3, bf16, global batch "
            "1024") in lines, lines
