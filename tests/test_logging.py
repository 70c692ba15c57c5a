"""The hpcfsdp logger (rank prefix, one write per record, job-wide records on rank 0, level from
HPCFSDP_LOG_LEVEL / --log-level) and single-write abort reports."""
import logging
import os
import socket
import subprocess
import sys

import pytest

from hpcfsdp import _logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import sys
from hpcfsdp import _logging
log = _logging.get_logger("test")
log.debug("a debug line")
log.info("an info line")
log.warning("a warning line")
log.warning("job-wide line", extra={"job": True})
"""


def _run(env_extra, code=SCRIPT, args=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_", "PMIX_"))}
    env.update(PYTHONPATH=ROOT, **env_extra)
    env.pop("HPCFSDP_LOG_LEVEL", None) if "HPCFSDP_LOG_LEVEL" not in env_extra else None
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60)


def test_default_level_is_warning_with_rank_prefix():
    p = _run({"PMI_RANK": "3", "PMI_SIZE": "8"})
    assert p.returncode == 0, p.stderr
    host = socket.gethostname()
    assert p.stderr.splitlines() == [f"[rank 3/8 {host}] warning hpcfsdp.test: a warning line"]


def test_level_from_the_environment_and_job_wide_lines_on_rank_0_only():
    p = _run({"PMI_RANK": "0", "PMI_SIZE": "2", "HPCFSDP_LOG_LEVEL": "debug"})
    lines = p.stderr.splitlines()
    assert [ln.split("hpcfsdp.test: ")[1] for ln in lines] == ["a debug line", "an info line", "a warning line",
                                                              "job-wide line"]
    assert all(ln.startswith(f"[rank 0/2 {socket.gethostname()}] ") for ln in lines)
    p = _run({"PMI_RANK": "1", "PMI_SIZE": "2", "HPCFSDP_LOG_LEVEL": "INFO"})
    assert [ln.split("hpcfsdp.test: ")[1] for ln in p.stderr.splitlines()] == ["an info line", "a warning line"]


def test_bad_level_names_the_variable():
    p = _run({"HPCFSDP_LOG_LEVEL": "loud"})
    assert p.returncode != 0 and "HPCFSDP_LOG_LEVEL='loud'" in p.stderr and "debug" in p.stderr
    with pytest.raises(ValueError, match="log level 'loud': expected one of"):
        _logging.set_level("loud")


def test_each_record_is_one_write_ending_in_a_newline(monkeypatch):
    writes = []
    monkeypatch.setattr(_logging.os, "write", lambda fd, data: writes.append((fd, data)) or len(data))
    log = _logging.get_logger("onewrite")
    old = log.parent.level
    try:
        _logging.set_level("info")
        log.info("two\nlines")
    finally:
        log.parent.setLevel(old)
    assert len(writes) == 1 and writes[0][0] == 2
    assert writes[0][1].endswith(b"two\nlines\n") and writes[0][1].startswith(b"[rank ")


def test_train_log_level_flag_sets_the_level():
    from hpcfsdp.cli.config import add_config_arguments
    import argparse

    parser = add_config_arguments(argparse.ArgumentParser())
    root = logging.getLogger("hpcfsdp")
    old = root.level
    try:
        ns = parser.parse_args(["--log-level", "debug"])
        assert root.level == logging.DEBUG and ns.log_level == "debug"
        with pytest.raises(SystemExit):
            parser.parse_args(["--log-level", "chatty"])
    finally:
        root.setLevel(old)
    from hpcfsdp.cli.config import config_from_args

    config_from_args(ns)  # not a TrainConfig field: the config is unaffected


def test_abort_report_is_one_write(monkeypatch):
    """The message and the traceback of an abort leave in one write, so ranks' reports never run together."""
    from hpcfsdp.distributed import _failure

    writes = []

    class FakeMPI:
        @staticmethod
        def Is_initialized():
            return False

    monkeypatch.setattr(_failure, "write_line", lambda text: writes.append(text))
    monkeypatch.setattr(_failure, "get_mpi", lambda: FakeMPI)
    monkeypatch.setattr(_failure, "_world", lambda: (2, 4))
    monkeypatch.setattr(_failure.os, "_exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    monkeypatch.setattr(_failure, "_ABORTING", False)
    try:
        raise KeyError("boom")
    except KeyError:
        tp, val, tb = sys.exc_info()
    with pytest.raises(SystemExit):
        _failure.abort_job("uncaught KeyError", lambda: sys.__excepthook__(tp, val, tb))
    assert len(writes) == 1, writes
    assert writes[0].startswith("hpcfsdp: rank 2 of 4 is aborting the job (MPI_Abort): uncaught KeyError\n"
                                "Traceback (most recent call last):")
    assert writes[0].rstrip().endswith("KeyError: 'boom'")


def test_init_process_group_says_one_job_line_on_rank_0_and_per_rank_debug_lines():
    code = ("import hpcfsdp.distributed as dist\n"
            "dist.init_process_group()\n"
            "dist.destroy_process_group()\n")
    p = _run({"HPCFSDP_LOG_LEVEL": "debug"}, code=code)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    assert any(ln.startswith("[rank 0/1 ") and "info hpcfsdp.distributed: process group 'default': 1 ranks, MPI"
               in ln for ln in lines), lines
    assert any("debug hpcfsdp.distributed: rank 0 of 1 on " in ln for ln in lines), lines
    assert _run({}, code=code).stderr == ""  # quiet at the default level


def test_job_wide_line_once_per_job_under_mpiexec():
    code = "import hpcfsdp.distributed as dist; dist.init_process_group(); dist.destroy_process_group()"
    env = dict(os.environ, PYTHONPATH=ROOT, HPCFSDP_LOG_LEVEL="debug", OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", "2", "--timeout", "60", "--",
                        sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "hpcfsdp.distributed" in ln]
    assert len([ln for ln in lines if "process group 'default': 2 ranks" in ln]) == 1, lines
    assert sorted(ln.split("]")[0] for ln in lines if "debug" in ln) == [
        f"[rank 0/2 {socket.gethostname()}", f"[rank 1/2 {socket.gethostname()}"], lines
    assert all(ln.startswith("[rank ") for ln in lines), lines  # one write per line: never run together
