"""Progress lines: rate and ETA, a bar on a terminal, and a line every HEARTBEAT_S on a log even
when no task finishes (issue 20: `1/19 tasks, 37.8s` and then nothing for 264 s)."""
import io
import threading
import time
from pathlib import Path


from corpusmill.pipeline import engine
from corpusmill.pipeline.engine import Heartbeat, Progress, run_tasks


def _wait_for(predicate, deadline_s: float = 60.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_lines_give_done_total_rate_and_eta():
    stream = io.StringIO()
    progress = Progress("02-filter: score", 20, stream=stream)
    for _ in range(20):
        progress.update()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("  02-filter: score: 1/20 tasks (5%), ") and "tasks/s" in lines[0] and "ETA" in lines[0]
    assert lines[-1].startswith("  02-filter: score: 20/20 tasks (100%)") and "ETA" not in lines[-1]


def test_a_log_gets_a_line_while_no_task_finishes():
    stream = io.StringIO()
    progress = Progress("04-near_dedup: signatures", 3, stream=stream, heartbeat_s=0.1)
    try:
        assert _wait_for(lambda: stream.getvalue().count("0/3 tasks") >= 2)
        assert "ETA after the first task" in stream.getvalue()
    finally:
        progress.close()


def test_a_terminal_gets_a_bar_redrawn_in_place():
    stream = _Terminal()
    progress = Progress("05-tokenize", 4, stream=stream)
    progress.update(2)
    progress.update(2)
    text = stream.getvalue()
    assert "\r  [##########..........] 05-tokenize: 2/4 tasks (50%)" in text
    assert text.endswith("\n") and "[####################] 05-tokenize: 4/4 tasks (100%)" in text


def test_a_blocking_step_without_tasks_says_it_is_still_running():
    lines: list[str] = []
    with Heartbeat("exact_dedup: grouping hashes (Dask shuffle)", lines.append, heartbeat_s=0.05):
        assert _wait_for(lambda: len(lines) >= 2)
    assert lines[0].startswith("  exact_dedup: grouping hashes (Dask shuffle): still running, ")


def _wait_for_file(path: str) -> int:
    """A task that finishes only when the test allows it."""
    end = time.monotonic() + 120
    while not Path(path).exists() and time.monotonic() < end:
        time.sleep(0.02)
    return 1


def test_run_tasks_on_the_cluster_reports_while_its_tasks_are_still_running(dask_client, tmp_path, capsys, monkeypatch):
    """Real Dask tasks held until the heartbeat was seen: the step is never silent."""
    from dask import delayed

    monkeypatch.setattr(engine, "HEARTBEAT_S", 0.1)
    release = tmp_path / "go"
    result: list = []
    runner = threading.Thread(target=lambda: result.append(
        run_tasks(dask_client, [delayed(_wait_for_file)(str(release), dask_key_name=f"held-{i}") for i in range(2)],
                  "held")))
    runner.start()
    seen = ""
    try:
        def beat():
            nonlocal seen
            seen += capsys.readouterr().err
            return seen.count("held: 0/2 tasks") >= 2
        assert _wait_for(beat)
    finally:
        release.write_text("go")
        runner.join(timeout=120)
    seen += capsys.readouterr().err
    assert result == [[1, 1]] and "held: 2/2 tasks (100%)" in seen
