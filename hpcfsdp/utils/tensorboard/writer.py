"""PyTorch's SummaryWriter: TensorBoard event files written by the tensorboard package's EventFileWriter."""
import os
import socket
import time
from datetime import datetime

from . import _summary

__all__ = ["SummaryWriter", "FileWriter"]

_MISSING = ("hpcfsdp.utils.tensorboard.SummaryWriter needs the tensorboard package: pip install tensorboard "
            "(or pip install 'hpcfsdp[tensorboard]')")


def _event_file_writer():
    try:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as e:
        raise ImportError(f"{_MISSING} ({e})") from None
    return EventFileWriter


class FileWriter:
    """One event file in ``log_dir`` (PyTorch's FileWriter): Summary protos wrapped in Events."""

    def __init__(self, log_dir, max_queue=10, flush_secs=120, filename_suffix=""):
        log_dir = os.fspath(log_dir)
        self.event_writer = _event_file_writer()(log_dir, max_queue, flush_secs, filename_suffix)

    def get_logdir(self) -> str:
        return self.event_writer.get_logdir()

    def add_event(self, event, step=None, walltime=None):
        event.wall_time = time.time() if walltime is None else float(walltime)
        if step is not None:
            event.step = int(step)
        self.event_writer.add_event(event)

    def add_summary(self, summary, global_step=None, walltime=None):
        from tensorboard.compat.proto.event_pb2 import Event

        self.add_event(Event(summary=summary), global_step, walltime)

    def flush(self):
        self.event_writer.flush()

    def close(self):
        self.event_writer.close()

    def reopen(self):
        self.event_writer.reopen()


def _step(global_step):
    if global_step is None:
        return None
    if hasattr(global_step, "item"):
        global_step = global_step.item()
    if isinstance(global_step, bool) or not isinstance(global_step, int):
        raise TypeError(f"global_step={global_step!r}: expected an int (or None)")
    return global_step


class SummaryWriter:
    """Writes TensorBoard event files into ``log_dir`` (default ``runs/<Mon>DD_HH-MM-SS_<host><comment>``),
    as ``torch.utils.tensorboard.SummaryWriter``: scalars, scalar groups, histograms, text and hparams.

    ``purge_step``: a run resumed from a checkpoint at step N passes N, and TensorBoard then drops the events
    at steps >= N that the earlier run wrote after its checkpoint (a SessionLog START event, as PyTorch).
    """

    def __init__(self, log_dir=None, comment="", purge_step=None, max_queue=10, flush_secs=120, filename_suffix=""):
        _event_file_writer()  # the clear ImportError before anything is created
        if not log_dir:
            stamp = datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", f"{stamp}_{socket.gethostname()}{comment}")
        self.log_dir = os.fspath(log_dir)
        self.purge_step = _step(purge_step)
        self.max_queue, self.flush_secs, self.filename_suffix = max_queue, flush_secs, filename_suffix
        self.file_writer = None
        self.all_writers = None
        self._get_file_writer()

    def _get_file_writer(self) -> FileWriter:
        """The writer of ``log_dir`` (reopened after close(), as PyTorch's)."""
        if self.all_writers is None or self.file_writer is None:
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog

            self.file_writer = FileWriter(self.log_dir, self.max_queue, self.flush_secs, self.filename_suffix)
            self.all_writers = {self.file_writer.get_logdir(): self.file_writer}
            if self.purge_step is not None:
                step, self.purge_step = self.purge_step, None
                self.file_writer.add_event(Event(step=step, file_version="brain.Event:2"))
                self.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))
        return self.file_writer

    def get_logdir(self) -> str:
        """The directory the event files go to."""
        return self.log_dir

    def add_scalar(self, tag, scalar_value, global_step=None, walltime=None, new_style=False,
                   double_precision=False):
        """One value of the curve ``tag`` at ``global_step`` (a number or a one-element Tensor)."""
        summary = _summary.scalar(_tag(tag), scalar_value, new_style=new_style, double_precision=double_precision)
        self._get_file_writer().add_summary(summary, _step(global_step), walltime)

    def add_scalars(self, main_tag, tag_scalar_dict, global_step=None, walltime=None):
        """Several curves in one chart: each key is a run ``log_dir/<main_tag>_<key>`` holding tag ``main_tag``."""
        main_tag = _tag(main_tag)
        if not isinstance(tag_scalar_dict, dict):
            raise TypeError(f"add_scalars({main_tag!r}): expected a dict of tag -> value, got "
                            f"{type(tag_scalar_dict).__name__}")
        step = _step(global_step)
        walltime = time.time() if walltime is None else walltime
        self._get_file_writer()
        for key, value in tag_scalar_dict.items():
            path = os.path.join(self.file_writer.get_logdir(), f"{main_tag}_{key}".replace("/", "_"))
            writer = self.all_writers.get(path)
            if writer is None:
                writer = FileWriter(path, self.max_queue, self.flush_secs, self.filename_suffix)
                self.all_writers[path] = writer
            writer.add_summary(_summary.scalar(main_tag, value), step, walltime)

    def add_histogram(self, tag, values, global_step=None, bins="tensorflow", walltime=None, max_bins=None):
        """The distribution of ``values`` (a Tensor or an array); ``bins`` as numpy.histogram, or "tensorflow"."""
        summary = _summary.histogram(_tag(tag), values, bins, max_bins)
        self._get_file_writer().add_summary(summary, _step(global_step), walltime)

    def add_text(self, tag, text_string, global_step=None, walltime=None):
        """A (Markdown) text under ``<tag>/text_summary``, as PyTorch writes it."""
        self._get_file_writer().add_summary(_summary.text(_tag(tag), text_string), _step(global_step), walltime)

    def add_hparams(self, hparam_dict, metric_dict, hparam_domain_discrete=None, run_name=None, global_step=None):
        """A row of TensorBoard's HParams table: the hyperparameters and the metrics they gave, in the run
        ``log_dir/<run_name>`` (default: the current time), as PyTorch writes them."""
        summaries = _summary.hparams(hparam_dict, metric_dict, hparam_domain_discrete)
        run = os.path.join(self._get_file_writer().get_logdir(), run_name or str(time.time()))
        with SummaryWriter(log_dir=run) as w:
            for s in summaries:
                w.file_writer.add_summary(s, _step(global_step))
            for k, v in metric_dict.items():
                w.add_scalar(k, v, global_step)

    def flush(self):
        """Write what is queued to disk."""
        for w in (self.all_writers or {}).values():
            w.flush()

    def close(self):
        """Flush and close every event file (a later add_* opens a new one)."""
        for w in (self.all_writers or {}).values():
            w.flush()
            w.close()
        self.file_writer = self.all_writers = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.close()


def _tag(tag) -> str:
    if not isinstance(tag, str) or not tag:
        raise TypeError(f"tag={tag!r}: expected a non-empty str")
    return tag
