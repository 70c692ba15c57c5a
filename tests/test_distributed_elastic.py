"""torchelastic error files: @record writes $TORCHELASTIC_ERROR_FILE on an uncaught exception and re-raises."""
import json
import time

import pytest

from hpcfsdp.distributed.elastic.multiprocessing.errors import (ChildFailedError, ErrorHandler, ProcessFailure,
                                                                get_error_handler, record)


@pytest.fixture
def error_file(tmp_path, monkeypatch):
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    return path


def test_record_is_transparent_without_an_exception(error_file):
    @record
    def main(a, b=2):
        """Docs."""
        return a + b

    assert main(1, b=3) == 4 and main.__name__ == "main" and main.__doc__ == "Docs."
    assert not error_file.exists()


def test_an_uncaught_exception_is_written_as_torchelastic_json_and_reraised(error_file):
    @record
    def main():
        raise ValueError("boom at step 7")

    before = int(time.time())
    with pytest.raises(ValueError, match="boom at step 7"):
        main()
    data = json.loads(error_file.read_text())
    msg = data["message"]
    assert set(data) == {"message"} and msg["message"] == "ValueError: boom at step 7"
    assert set(msg["extraInfo"]) == {"py_callstack", "timestamp"}
    assert "Traceback (most recent call last)" in msg["extraInfo"]["py_callstack"]
    assert 'raise ValueError("boom at step 7")' in msg["extraInfo"]["py_callstack"]
    assert before <= int(msg["extraInfo"]["timestamp"]) <= int(time.time())


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)

    @record
    def main():
        raise KeyError("k")

    with pytest.raises(KeyError):
        main()
    assert list(tmp_path.iterdir()) == []


def test_system_exit(error_file):
    def leave(code):
        raise SystemExit(code)

    assert record(leave)(0) is None  # SystemExit(0): a normal return, as torchelastic
    with pytest.raises(SystemExit):
        record(leave)(3)
    assert not error_file.exists()


def test_child_failure_is_copied_to_the_parents_error_file(tmp_path, monkeypatch, error_file):
    child = tmp_path / "child.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(child))
    with pytest.raises(RuntimeError):
        record(lambda: (_ for _ in ()).throw(RuntimeError("child died")))()
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    first = ProcessFailure(local_rank=0, pid=11, exitcode=1, error_file=str(child))
    killed = ProcessFailure(local_rank=1, pid=12, exitcode=-9, error_file=str(tmp_path / "none.json"))
    assert first.message["message"] == "RuntimeError: child died" and killed.error_file == "<N/A>"
    assert killed.message == "Signal 9 (SIGKILL) received by PID 12" and killed.signal_name() == "SIGKILL"
    killed.timestamp = first.timestamp + 5
    err = ChildFailedError("trainer", {3: first, 5: killed})
    assert err.get_first_failure() == (3, first)
    text = str(err)
    assert "trainer FAILED" in text and text.index("[1]:") < text.index("Root Cause") < text.index("[0]:")
    assert "rank      : 3 (local_rank: 0)" in text and "(SIGKILL)" in text and "child died" in text

    @record
    def parent():
        raise err

    with pytest.raises(ChildFailedError):
        parent()
    data = json.loads(error_file.read_text())
    assert data["message"]["message"] == "RuntimeError: child died" and data["message"]["errorCode"] == 1
    with pytest.raises(ValueError, match="at least one failure"):
        ChildFailedError("trainer", {})


def test_a_custom_error_handler():
    seen = []

    class Handler(ErrorHandler):
        def initialize(self):
            seen.append("init")

        def record_exception(self, e):
            seen.append(type(e).__name__)

    def main():
        raise OSError("disk")

    with pytest.raises(OSError):
        record(main, error_handler=Handler())()
    assert seen == ["init", "OSError"] and isinstance(get_error_handler(), ErrorHandler)
