"""`hpcfsdp launch --max-restarts K --min-ranks M`: rerun a job that lost ranks on what survives, resuming.

[Note: Restarts without ULFM]
An MPI without ULFM cannot shrink a running job: when a rank dies (kill -9, the OOM killer, a node
failing) every rank of the job ends. So the launcher restarts the whole job, as torchelastic does: the
rank wrappers name each rank that died by a signal (see [Note: Rank wrapper] in rankwrap.py), and when
the job failed with at least one such rank, the launcher starts it again on what survived, at most
--max-restarts times and only while at least --min-ranks ranks remain. What survived:

  * without a host list (one machine), every rank but the lost ones: the world shrinks by the number
    of ranks lost (with --ranks-per-node K, by each simulated node that lost a rank: K ranks each);
  * with --hosts or --hostfile, every host but the ones a lost rank ran on (a host that kills one rank
    may kill the next; Slurm drains such a node too). Each surviving host keeps its number of slots.
    A host that died with all its ranks leaves no wrapper to say so; Hydra then says it lost the
    connection to that host's proxy ("control_cb ... assert (!closed) failed") and exits 255. The
    launcher then probes every host (`mpiexec -n 1 -hosts H:1 true`, all at once, 10 s at most) and
    drops those that do not answer; without a host list it cannot tell which host it was, and stops.

A relaunched `hpcfsdp train` resumes from the newest disk checkpoint, CHECKPOINT_DIR/latest (the
launcher adds `--resume` once it exists, overriding the command's own resume flags, which named the
start of the first run), and train reshards it to the new world size; the steps the failed run made
after that checkpoint are trained again, and its metrics log drops their records (see [Note: Exact
resume] in train.py). Other commands are rerun unchanged. A job that ended 0, was stopped by a signal
(75) or by Ctrl-C (130), that the launcher itself was told to stop, that ran out of --timeout, or that
failed without a lost rank (an exception: rerunning it would fail again) is never restarted. The
launcher says in one line per restart what was lost, the new world size and the checkpoint it resumes
from, and in one line why it stops restarting; the exit status is then the failure's.
"""

import argparse
import dataclasses
import os
import sys
import time

__all__ = ["Lost", "Decision", "parse_hosts", "read_hostfile", "place", "host_of_rank", "decide", "resume_command",
           "check_min_ranks", "run", "probe_hosts", "NEVER_RESTARTED", "PROXY_LOST"]

NEVER_RESTARTED = {0, 75, 124, 130}
PROXY_LOST = -1  # Lost.rank of Hydra's "control_cb ... assert (!closed) failed": a host's proxy is gone  # done, stopped (runtime.STOPPED_EXIT), --timeout, Ctrl-C (INTERRUPTED_EXIT)


@dataclasses.dataclass(frozen=True)
class Lost:
    """A rank its wrapper reported killed by a signal."""

    rank: int  # PROXY_LOST: mpiexec lost a host's proxy (the host died, or every process on it), host unknown
    signal: int
    host: str = "?"  # the hostname the wrapper printed


@dataclasses.dataclass(frozen=True)
class Decision:
    restart: bool
    why: str  # what was lost and what happens now, or why no restart, in words
    nprocs: int = 0  # the new world size
    hosts: tuple = ()  # the surviving (host, slots), when the job has a host list


def parse_hosts(spec: str) -> list:
    """``a,b:2,c`` -> [("a", None), ("b", 2), ("c", None)]; ValueError on a bad entry."""
    out = []
    for item in spec.replace("\n", ",").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, slots = item.partition(":")
        if not name or (slots and (not slots.isdigit() or int(slots) < 1)):
            raise ValueError(f"host {item!r}: expected NAME or NAME:SLOTS (a positive number of ranks)")
        out.append((name, int(slots) if slots else None))
    if not out:
        raise ValueError(f"no host in {spec!r}")
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"host {next(n for n in names if names.count(n) > 1)!r} is listed twice")
    return out


def read_hostfile(path: str) -> list:
    """A hostfile: one ``NAME`` or ``NAME:SLOTS`` per line (Hydra's format; ``NAME slots=N`` as Open MPI's); ``#``
    comments."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"--hostfile {path!r}: {e.strerror}") from None
    items = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = next((w.split("=", 1)[1] for w in words[1:] if w.startswith(("slots=", "max_slots="))), None)
        items.append(words[0] + (f":{slots}" if slots and ":" not in words[0] else ""))
    if not items:
        raise ValueError(f"--hostfile {path!r} names no host")
    return parse_hosts(",".join(items))


def place(hosts, nprocs) -> list:
    """The (host, slots) that run ``nprocs`` ranks in order (ranks fill a host's slots, then the next host's): hosts
    without a slot count share what the others leave, evenly. ValueError where they cannot hold exactly nprocs."""
    fixed = sum(s for _, s in hosts if s is not None)
    free = [n for n, s in hosts if s is None]
    rest = nprocs - fixed
    if free:
        if rest < len(free) or rest % len(free):
            raise ValueError(f"-n {nprocs} ranks do not spread evenly over {len(hosts)} host(s) "
                             f"({fixed} slot(s) given): give each host its slots, NAME:SLOTS")
        each = rest // len(free)
        return [(n, s if s is not None else each) for n, s in hosts]
    if rest != 0:
        raise ValueError(f"the hosts have {fixed} slot(s) but -n is {nprocs}: give -n {fixed} or change the slots")
    return list(hosts)


def host_of_rank(placed, rank: int, reported: str = "?") -> str:
    """The host of ``placed`` that ran ``rank``: the hostname its wrapper printed where it is one of them (also as
    a short name), else by placement."""
    names = [n for n, _ in placed]
    for cand in (reported, reported.split(".")[0]):
        for n in names:
            if cand == n or cand == n.split(".")[0]:
                return n
    first = 0
    for n, s in placed:
        if rank < first + s:
            return n
        first += s
    return names[-1]


def check_min_ranks(min_ranks, nprocs) -> None:
    if min_ranks is not None and not 1 <= min_ranks <= nprocs:
        raise ValueError(f"--min-ranks {min_ranks} must be 1..{nprocs} (-n): a job cannot restart on more ranks "
                         "than it started with")


def _lost_words(lost) -> str:
    import signal

    def name(sig):
        try:
            return signal.Signals(sig).name
        except ValueError:
            return f"signal {sig}"

    return ", ".join(f"rank {x.rank} (host {x.host}, {name(x.signal)})" for x in lost)


def decide(code: int, lost, *, nprocs: int, min_ranks: int, restarts: int, max_restarts: int, hosts=None,
           ranks_per_node=None, stopped=False, unreachable=()) -> Decision:
    """Whether a job of ``nprocs`` ranks that ended with ``code`` after losing ``lost`` (Lost records) is restarted,
    having been restarted ``restarts`` times; ``hosts`` is its placement ((host, slots), see place) if it has a
    host list, ``unreachable`` the hosts that did not answer after a host's proxy was lost (probe_hosts). See
    [Note: Restarts without ULFM]."""
    if code in NEVER_RESTARTED or stopped:
        return Decision(False, "")
    proxy = any(x.rank == PROXY_LOST for x in lost)
    lost = sorted({x.rank: x for x in lost if x.rank >= 0}.values(), key=lambda x: x.rank)
    if not lost and not (proxy and hosts):
        why = ("mpiexec lost a host's proxy, and without --hosts/--hostfile the launcher cannot tell which host"
               if proxy else "without losing a rank")
        return Decision(False, f"the job failed (exit {code}) {why}: not restarted" +
                        ("" if proxy else " (it would fail again)"))
    what = "; ".join(([f"lost {_lost_words(lost)}"] if lost else []) +
                     ([f"mpiexec lost a host's proxy ({'unreachable: ' + ', '.join(sorted(unreachable)) if unreachable else 'every host answers again'})"]
                      if proxy else []))
    if hosts:
        gone = {host_of_rank(hosts, x.rank, x.host) for x in lost} | set(unreachable)
        left = tuple((n, s) for n, s in hosts if n not in gone)
        world = sum(s for _, s in left)
        if gone:
            what += f"; dropping host(s) {', '.join(sorted(gone))}"
    else:
        left = ()
        if ranks_per_node:
            nodes = {x.rank // ranks_per_node for x in lost}
            world = nprocs - ranks_per_node * len(nodes)
        else:
            world = nprocs - len(lost)
    if restarts >= max_restarts:
        return Decision(False, f"{what}; not restarted: --max-restarts {max_restarts} used up")
    if world < max(min_ranks, 1):
        return Decision(False, f"{what}; not restarted: {world} rank(s) would remain, fewer than --min-ranks "
                        f"{min_ranks}")
    return Decision(True, what, world, left)


def run(attempt, nprocs, cmd, *, hosts=None, timeout=None, max_restarts=0, min_ranks=None, ranks_per_node=None) -> int:
    """Run ``attempt(nprocs, cmd, placed, timeout, outcome) -> exit status`` (one job; it fills ``outcome`` with
    "lost", the Lost records, and "stopped") and rerun it as [Note: Restarts without ULFM] says; ``timeout``
    bounds every attempt together. Returns the last attempt's status."""
    placed = place(hosts, nprocs) if hosts else None
    if max_restarts < 0:
        raise ValueError(f"--max-restarts {max_restarts} must be 0 or more")
    check_min_ranks(min_ranks, nprocs)
    deadline = None if timeout is None else time.monotonic() + timeout
    restarts = 0
    while True:
        outcome = {}
        code = attempt(nprocs, cmd, placed, None if deadline is None else max(deadline - time.monotonic(), 0.001),
                       outcome)
        if not max_restarts:
            return code
        d = decide(code, outcome.get("lost", ()), nprocs=nprocs, min_ranks=min_ranks or 1, restarts=restarts,
                   max_restarts=max_restarts, hosts=placed, ranks_per_node=ranks_per_node,
                   stopped=outcome.get("stopped", False), unreachable=outcome.get("unreachable", ()))
        if not d.restart:
            if d.why:
                print(f"hpcfsdp launch: {d.why}; exit {code}", file=sys.stderr, flush=True)
            return code
        restarts += 1
        cmd, where = resume_command(cmd)
        on = f" (hosts {', '.join(f'{h}:{s}' for h, s in d.hosts)})" if d.hosts else ""
        print(f"hpcfsdp launch: restart {restarts}/{max_restarts}: {d.why}; restarting on {d.nprocs} rank(s){on}, "
              f"{where}", file=sys.stderr, flush=True)
        nprocs, placed = d.nprocs, list(d.hosts) or None


def probe_hosts(mpiexec, vendor, hosts, timeout=10.0) -> set:
    """The hosts of ``hosts`` ((host, slots) pairs) on which ``mpiexec`` cannot run `true` within ``timeout``
    seconds, each probed on its own, all at once."""
    import signal
    import subprocess

    procs = {}
    for h, _ in hosts:
        argv = [mpiexec, "-n", "1", "--host" if vendor == "openmpi" else "-hosts", f"{h}:1", "true"]
        try:
            procs[h] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            procs[h] = None
    deadline = time.monotonic() + timeout
    bad = set()
    for h, p in procs.items():
        if p is None:
            bad.add(h)
            continue
        try:
            if p.wait(timeout=max(deadline - time.monotonic(), 0.01)) != 0:
                bad.add(h)
        except subprocess.TimeoutExpired:
            bad.add(h)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()
    return bad


# ----------------------------------------------------------------------------------- resuming

_RESUME_FLAGS = {"--resume": 0, "--no-resume": 0, "--resume-if-exists": 0, "--no-resume-if-exists": 0,
                 "--resume-from": 1}


def _train_args(cmd):
    """The arguments after `train` when ``cmd`` runs `hpcfsdp train` (any of the launcher's spellings), else None."""
    for i, word in enumerate(cmd):
        if word == "train" and i > 0 and (os.path.basename(cmd[i - 1]) == "hpcfsdp" or cmd[i - 1] == "hpcfsdp.cli.main"):
            return i + 1
    return None


def _checkpoint_dir(args):
    """CHECKPOINT_DIR as `hpcfsdp train` resolves it from ``args`` (flags and --config FILE); None if none or bad."""
    from .config import ConfigError, add_config_arguments, config_from_args

    p = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    add_config_arguments(p)
    try:
        ns, _ = p.parse_known_args(args)
        return config_from_args(ns).checkpoint_dir
    except (ConfigError, argparse.ArgumentError, ValueError, OSError, SystemExit):
        return None


def _step_of(path):
    try:
        from hpcfsdp.distributed.checkpoint import read_metadata

        from ._checkpoint_summary import _step

        return _step(read_metadata(path))
    except Exception:  # an unreadable checkpoint: train says why when it resumes
        return None


def resume_command(cmd):
    """The command that continues ``cmd`` after a failure, and the checkpoint it resumes from in words. See
    [Note: Restarts without ULFM]."""
    at = _train_args(cmd)
    if at is None:
        return list(cmd), "the command is not `hpcfsdp train`: rerun unchanged"
    ckpt_dir = _checkpoint_dir(cmd[at:])
    if not ckpt_dir:
        return list(cmd), "no --checkpoint-dir: starting again from the command's own start"
    latest = os.path.join(ckpt_dir, "latest")
    if not os.path.lexists(latest):
        return list(cmd), f"no checkpoint in {ckpt_dir} yet: starting again from the command's own start"
    head, args, i = list(cmd[:at]), [], at
    while i < len(cmd):
        word = cmd[i]
        flag = word.split("=", 1)[0]
        if flag in _RESUME_FLAGS:
            i += 1 + (_RESUME_FLAGS[flag] if "=" not in word else 0)
            continue
        args.append(word)
        i += 1
    step = _step_of(latest)
    # the resume flags of a --config FILE are overridden too (train takes one of the three)
    return head + args + ["--resume", "--no-resume-if-exists", "--resume-from", "none"], f"resuming from {latest}" + (f" (step {step})" if step is not None else "")
