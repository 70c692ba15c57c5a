"""`hpcfsdp slurm`: render sbatch job scripts from the templates and the trainer's configuration.

[Note: Slurm templates]
The templates in `hpcfsdp/slurm_templates/*.sbatch` are `string.Template` text: `${name}` is a
placeholder filled here and `$$` is a literal `$` for bash. `render_script` resolves the training
configuration exactly as `hpcfsdp train` does (`config_from_args`: defaults, `--config FILE`,
flags), validates it for the job's world size (nodes x ranks per node), and writes it into the
script as explicit `hpcfsdp train` flags, so a job script is self-contained and fails at render
time, not after waiting in the queue. Every setting is written, those equal to today's defaults
too (a later hpcfsdp whose defaults differ runs a queued job as it was rendered), and the paths
among them (data, checkpoints, outputs, the job log) are made absolute against the directory
render ran in (`workdir`), so the job does not depend on where it is submitted from. `--setup`
lines (module loads, a venv's activate) run in the batch shell before the launch. GPUs are requested with `--gpus-per-node` and never with
`--gpus-per-task`; each template's header explains why. `slurm/` at the top of the repository
holds the templates rendered with example settings (`render_examples`); a test keeps them equal.
"""

import argparse
import dataclasses
import importlib.metadata
import importlib.resources
import os
import re
import shlex
import shutil
import string
import subprocess
import sys

from hpcfsdp.cli.config import (
    ConfigError,
    TrainConfig,
    add_config_arguments,
    config_from_args,
    exit_with_config_error,
    format_mesh,
    load_config_file,
)
from hpcfsdp.cli.config import _step_spec

from . import _slurm_restart

__all__ = [
    "add_parser",
    "render_script",
    "render_examples",
    "template_text",
    "TEMPLATES",
    "MPI_PLUGINS",
    "LAUNCHERS",
    "mpi_needs_pmi2",
]

# template name -> (file in hpcfsdp/slurm_templates, one-line description)
TEMPLATES = {
    "single-node": ("single_node.sbatch", "one node, one rank per GPU, any strategy (FULL_SHARD default)"),
    "multi-node": ("multi_node_fsdp.sbatch", "several nodes, FULL_SHARD (or SHARD_GRAD_OP / NO_SHARD) over all ranks"),
    "hsdp": ("multi_node_hsdp.sbatch", "several nodes, HYBRID_SHARD: shard inside a node, replicate across nodes"),
    "bench-comm": ("bench_comm.sbatch", "collective benchmark (`hpcfsdp bench comm`) over the allocation"),
}
MPI_PLUGINS = ("default", "pmix", "pmi2", "cray_shasta", "none")  # srun --mpi=...; default = site's MpiDefault
LAUNCHERS = ("srun", "mpiexec")
ENTRIES = ("module", "script")  # python -m mpi4py -m hpcfsdp.cli.main | the `hpcfsdp` console script

_COMMON_DOC = """\
#
# GPU binding: the job asks for --gpus-per-node, so every task on a node sees all of
#   the node's GPUs and each rank uses the GPU numbered by its node-local rank, from
#   MPI's shared-memory split (not SLURM_LOCALID: 0 on every rank under mpiexec).
#   Do not use --gpus-per-task: it fences each task into its own GPU (cgroup and
#   CUDA_VISIBLE_DEVICES), the peers' GPUs vanish from the process, and CUDA IPC,
#   the on-node fast path of CUDA-aware MPI, breaks.
# CUDA-aware MPI: probed at start (see `hpcfsdp info`); HPCFSDP_CUDA_AWARE=0|1 forces
#   it. On Cray (HPE Cray MPICH, srun --mpi=cray_shasta) MPICH_GPU_SUPPORT_ENABLED=1 must
#   be set or Cray MPICH rejects GPU buffers; `--mpi cray_shasta` exports it.
# Threads: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS follow --cpus-per-task (1 if unset)
#   so the ranks of a node do not oversubscribe its cores; SRUN_CPUS_PER_TASK hands
#   --cpus-per-task on to srun (Slurm >= 22.05 no longer passes it by itself).
# Failure: srun --kill-on-bad-exit=1 ends the step when a rank fails, and
#   `python -m mpi4py` aborts MPI on an uncaught exception: no rank is left in a collective.
{restart_doc}# Interpreter: {python} (the Python `hpcfsdp slurm render` ran under; with
#   --launcher mpiexec, the mpiexec next to it if there is one);
#   PYTHON=/path/to/venv/bin/python sbatch <this file> runs another.
# Preemption: Slurm sends USR1 to this batch shell {signal_seconds} s before the time limit
#   (--signal=B:USR1@{signal_seconds}); the trap below forwards it (and TERM, as USR1) to the job step,
#   whose ranks agree to stop at the next step boundary, write CHECKPOINT_DIR/latest and
#   exit {stopped}. {requeue_doc}
#   The job resumes from CHECKPOINT_DIR/latest by itself (--resume-if-exists; none yet: step 0).
{settings_doc}# Rendered by `hpcfsdp slurm render --template {template}`; edit the flags after
#   `train` or render again.
#"""

_SETTINGS_DOC = """\
# Settings: every `hpcfsdp train` setting is written below, defaults too, so a later hpcfsdp
#   with other defaults runs this job as rendered; paths are absolute, resolved against
#   {workdir} when rendered.
"""

_TIME_RE = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")  # sbatch --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_NAME_RE = re.compile(r"^[A-Za-z0-9._+%-]+$")
_LIST_RE = re.compile(r"^[A-Za-z0-9._,:&|()\[\]-]+$")


def template_text(name: str) -> str:
    """Raw text of template `name` (a key of TEMPLATES)."""
    if name not in TEMPLATES:
        raise ValueError(f"template {name!r}: expected one of {', '.join(TEMPLATES)}")
    res = importlib.resources.files("hpcfsdp").joinpath("slurm_templates", TEMPLATES[name][0])
    return res.read_text(encoding="utf-8")


def _format_args(tokens, indent="    "):
    """Train flags one per line (a flag with its values), each line ending in a bash continuation."""
    lines, cur = [], []
    for tok in tokens:
        if tok.startswith("--") and cur:
            lines.append(cur)
            cur = []
        cur.append(shlex.quote(tok))
    if cur:
        lines.append(cur)
    if not lines:
        return ""
    out = [indent + indent + " ".join(line) for line in lines]
    return " \\\n".join(out)


def render_script(
    template=None,
    *,
    nodes=1,
    gpus_per_node=4,
    ntasks_per_node=None,
    config=None,
    config_explicit=(),
    mesh_auto=False,
    partition=None,
    account=None,
    time="00:30:00",
    job_name=None,
    output="%x-%j.out",
    cpus_per_task=None,
    exclusive=False,
    qos=None,
    constraint=None,
    mpi="default",
    launcher="srun",
    entry="module",
    cuda_aware="auto",
    bench_args="",
    python="python3",
    signal_seconds=120,
    requeue=None,
    setup=None,
    workdir=None,
    max_restarts=2,
    min_ranks=1,
) -> str:
    """Fill a template; returns the sbatch script. Bad settings raise ConfigError naming the field.

    `config` is the TrainConfig to run (default TrainConfig()); `config_explicit` names the fields
    the user set (flags or file), which render leaves alone: an unset `device` follows
    `gpus_per_node`, an unset `strategy` follows the template, and an unset `mesh` (or `mesh_auto`)
    becomes (nodes, ranks per node) for HYBRID_SHARD.

    `setup` (a string or a list of them, bash) runs in the batch shell before the launch; `workdir`
    (default: the current directory) is what relative paths of the configuration and `output` are
    resolved against. A training job whose step loses nodes reruns it on the others up to `max_restarts` times
    while `min_ranks` remain, and requeues itself below that (see [Note: Node failures in a Slurm job]).
    """
    cfg = TrainConfig(**vars(config)) if config is not None else TrainConfig()
    workdir = os.path.abspath(os.getcwd() if workdir is None else os.path.expanduser(workdir))
    site_setup = _site_setup(setup)
    requeue = cfg.requeue if requeue is None else requeue
    cfg.requeue = False  # the batch script requeues, once the step has ended (see _RUN_STEP)
    if not _positive_int(signal_seconds):
        raise ConfigError(f"signal_seconds={signal_seconds!r}: expected a positive number of seconds")
    if template != "bench-comm" and "checkpoint_dir" not in set(config_explicit) and cfg.checkpoint_dir is None:
        cfg.checkpoint_dir = "checkpoints"
    resume_set = {"resume", "resume_if_exists", "resume_from"} & set(config_explicit)
    if template != "bench-comm" and cfg.checkpoint_dir and not resume_set:
        cfg.resume_if_exists = True  # a requeued or resubmitted job continues from latest; its first run has none
    _absolute_paths(cfg, workdir)
    if _NAME_RE.match(_absolute(output, workdir).replace("/", "")):  # an #SBATCH value has no quoting: no spaces
        output = _absolute(output, workdir)
    ntasks_per_node = _check_job(nodes, gpus_per_node, ntasks_per_node, cpus_per_task, time,
                                 {"mpi": mpi, "launcher": launcher, "entry": entry, "cuda_aware": cuda_aware},
                                 {"job_name": job_name, "output": output, "partition": partition, "account": account,
                                  "qos": qos, "constraint": constraint})
    template = _resolve_config(template, cfg, set(config_explicit), nodes, gpus_per_node, ntasks_per_node,
                               mesh_auto)
    world_size = nodes * ntasks_per_node
    from hpcfsdp.cli.runtime import STOPPED_EXIT

    restartable = template != "bench-comm"
    restart_doc = _slurm_restart.check(max_restarts, min_ranks, world_size) if restartable else ""

    requeue_doc = (f"Then (exit {STOPPED_EXIT}) this script runs `scontrol requeue $SLURM_JOB_ID` (--requeue)."
                   if requeue else "Render with --requeue to requeue the job then.")
    extra = [f"#SBATCH --signal=B:USR1@{signal_seconds}"]
    if restartable and max_restarts and nodes > 1:
        extra.append("#SBATCH --no-kill")  # a failed node does not end the job: the script reruns the step
    if requeue:  # a requeued job writes the same --output file: append, keeping the first run's log
        extra += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
    values = {
        "common_doc": _COMMON_DOC.format(template=template, python=python, signal_seconds=signal_seconds,
                                         restart_doc=restart_doc,
                                         stopped=STOPPED_EXIT, requeue_doc=requeue_doc,
                                         settings_doc=_SETTINGS_DOC.format(workdir=workdir)
                                         if template != "bench-comm" else ""),
        "job_name": job_name or f"hpcfsdp-{template}",
        "nodes": nodes,
        "ntasks_per_node": ntasks_per_node,
        "mesh": format_mesh(cfg.mesh) if cfg.mesh is not None else str(world_size),
        "gpu_directive": (f"#SBATCH --gpus-per-node={gpus_per_node}" if gpus_per_node > 0
                          else "# CPU-only job: no GPUs requested (--gpus-per-node 0)."),
        "time": time,
        "output": output,
        "extra_directives": "\n".join(extra + _extra_directives(cpus_per_task, exclusive, partition=partition,
                                                         account=account, qos=qos, constraint=constraint)),
        "site_setup": site_setup,
        "env_setup": "\n".join(_env_setup(mpi, gpus_per_node, cuda_aware, python)),
        "launch": " ".join(_launch_words(launcher, mpi, nodes, ntasks_per_node, template, _mpiexec_of(python),
                                         restartable)),
        "restart_setup": _slurm_restart.SETUP.format(nodes=nodes, ranks=world_size) if restartable else "",
        "entry": '"$PYTHON" -m mpi4py -m hpcfsdp.cli.main' if entry == "module" else "hpcfsdp",
        "train_args": _format_args(_resolved(cfg).to_args(only_changed=False)) + f" {_slurm_restart.AGAIN} &",
        "bench_args": "".join(" " + shlex.quote(t) for t in (_bench_words(bench_args, gpus_per_node))) + " &",
        "wait_step": _RUN_STEP.format(stopped=STOPPED_EXIT, requeue=1 if requeue else 0) + (_slurm_restart.after_step(
            launcher=launcher, per_node=ntasks_per_node, max_restarts=max_restarts, min_ranks=min_ranks,
            stopped=STOPPED_EXIT, checkpoint_dir=cfg.checkpoint_dir, resume_from=cfg.resume_from,
            hsdp_mesh=template == "hsdp" and (mesh_auto or "mesh" not in set(config_explicit)))
            if restartable else 'exit "$status"\n'),
    }
    text = string.Template(template_text(template)).substitute(values)
    while "\n\n\n" in text:  # an empty placeholder line
        text = text.replace("\n\n\n", "\n\n")
    assert "--gpus-per-task" not in text.replace("Do not use --gpus-per-task", ""), "template requests --gpus-per-task"
    return text


# [Note: Forwarding the warning signal]
# `--signal=B:USR1@T` signals only the batch shell, and bash runs a trap only between commands: a
# step run in the foreground would hold the trap until it ended. So the step runs in the background,
# the shell waits for it, and the trap sends the signal on to srun (or mpiexec), which delivers it
# to every rank. `wait` returns early when a trapped signal arrives, hence the loop. A rank takes the
# signal from the moment `hpcfsdp train` has parsed its flags and ignores it once training has ended;
# only a rank still starting (Python loading) dies of it, before training anything since the last
# checkpoint, so a step that ended of the very signal forwarded counts as stopped.
# The shell forwards USR1 whatever it received: a TERM reaching the batch shell comes from scancel or the
# time limit, which signal srun as well, and srun ends its step at once (SIGKILL) on a second TERM within
# a second; USR1 is the same stop to `hpcfsdp train` (seen on a real Slurm: without this a plain scancel
# often lost the final checkpoint).
_RUN_STEP = """\
step=$!
got=
forward() {{ echo "hpcfsdp: $1 received: the job step checkpoints at its next step and stops"; got=USR1; kill -s USR1 "$step" 2>/dev/null || true; }}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
set +e
while kill -0 "$step" 2>/dev/null; do wait "$step"; done
wait "$step"; status=$?
if [ -n "$got" ] && [ "$status" -eq $((128 + $(kill -l "$got"))) ]; then
    echo "hpcfsdp: the job step ended of $got while starting, before training: nothing to checkpoint"
    status={stopped}
fi
if [ "$status" -eq {stopped} ] && [ {requeue} -eq 1 ] && [ -n "${{SLURM_JOB_ID:-}}" ]; then
    echo "hpcfsdp: stopped with a final checkpoint: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
fi
"""


def _bench_words(bench_args, gpus_per_node) -> list:
    words = shlex.split(bench_args) if bench_args else []
    if gpus_per_node > 0 and "--device" not in words and not any(w.startswith("--device=") for w in words):
        words += ["--device", "cuda"]
    return words


def _resolved(cfg):
    """``cfg`` with the switches that default to the model's choice (bias, tie_weights: None) written as that choice,
    so the job keeps them whatever a later version's defaults (a flag cannot say None)."""
    from hpcfsdp.models import GPTConfig, LlamaConfig

    model = {"gpt": GPTConfig, "llama": LlamaConfig}[cfg.model]
    own = {f.name: f.default for f in dataclasses.fields(model)}
    return dataclasses.replace(cfg, **{k: own[k] for k in ("bias", "tie_weights") if getattr(cfg, k) is None})


# TrainConfig fields that hold paths, made absolute at render time (`init_from` where the trainer has it).
_PATH_FIELDS = ("data", "checkpoint_dir", "out_dir", "metrics_path", "trace", "resume_from", "init_from")


def _absolute(path, workdir):
    return os.path.normpath(os.path.join(workdir, os.path.expanduser(str(path))))


def _absolute_paths(cfg, workdir) -> None:
    """The path settings of ``cfg`` resolved against ``workdir`` (in place); ``resume_from=step-N`` stays a step."""
    for name in _PATH_FIELDS:
        value = getattr(cfg, name, None)
        if value is None or (name == "resume_from" and _step_spec(value) is not None):
            continue
        setattr(cfg, name, _absolute(value, workdir))


def _site_setup(setup) -> str:
    """The script's lines for ``--setup`` (each one as given), checked with `bash -n`; "" without any."""
    lines = [setup] if isinstance(setup, str) else list(setup or ())
    for line in lines:
        if not isinstance(line, str) or not line.strip() or "\0" in line:
            raise ConfigError(f"setup={line!r}: expected shell commands, e.g. 'module load mpich; source venv/bin/activate'")
    if not lines:
        return ""
    text = "\n".join(line.strip() for line in lines)
    bash = shutil.which("bash")
    if bash is not None:
        res = subprocess.run([bash, "-n"], input=text, text=True, capture_output=True, timeout=30)
        if res.returncode != 0:
            err = " ".join(res.stderr.replace("bash: ", "").split())
            raise ConfigError(f"setup={text!r}: not valid bash ({err})")
    # Lmod's `module` and some activate scripts read unset variables: -u is off while they run.
    return ("# Site setup (hpcfsdp slurm render --setup), before the launch:\n"
            f"set +u\n{text}\nset -u\n")


# [Note: The MPICH wheel needs srun --mpi=pmi2]
# The `mpich` wheel from PyPI (the [mpich] extra) has no Slurm PMI of its own: srun must start it through
# its pmi2 plugin, or each task initialises a one-rank MPI (train then refuses to run, naming the fix). A
# script rendered with `--mpi default` leaves the plugin to the site's MpiDefault, so `slurm render` warns
# when mpi4py here would load that wheel's libmpi and the slurm.conf it can read does not say pmi2. What
# mpi4py loads is found as mpi4py finds it (MPI4PY_LIBMPI, else libmpi under the environment's prefixes),
# without loading or initialising MPI.

_LIBMPI_NAMES = ("libmpi.so", "libmpi.so.12", "libmpi.so.40")


def _wheel_libmpi() -> set:
    """Real paths of the libmpi files the installed `mpich` wheel holds (empty without it)."""
    try:
        dist = importlib.metadata.distribution("mpich")
    except importlib.metadata.PackageNotFoundError:
        return set()
    return {os.path.realpath(dist.locate_file(f)) for f in (dist.files or ())
            if os.path.basename(str(f)).startswith("libmpi.so")}


def _mpi4py_libmpi(prefixes, environ) -> str | None:
    """The libmpi mpi4py would load (its MPI4PY_LIBMPI, else the first under ``prefixes``/lib), or None."""
    given = environ.get("MPI4PY_LIBMPI")
    candidates = given.split(os.pathsep) if given else [os.path.join(p, "lib", n) for p in prefixes
                                                        for n in _LIBMPI_NAMES]
    return next((c for c in candidates if os.path.isfile(c)), None)


def _site_mpi_default(environ) -> str | None:
    """MpiDefault of the slurm.conf this machine's Slurm commands read (SLURM_CONF), or None if unreadable."""
    path = environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    found = re.findall(r"^\s*MpiDefault\s*=\s*(\S+)", text, flags=re.IGNORECASE | re.MULTILINE)
    return found[-1].lower() if found else "none"  # slurm.conf(5): MpiDefault defaults to none


def mpi_needs_pmi2(prefixes=None, environ=None) -> str | None:
    """Why a job run from this environment needs ``srun --mpi=pmi2`` (mpi4py loads the MPICH wheel), or None.

    ``prefixes`` are where mpi4py looks for libmpi (default: this environment's, as mpi4py's own list);
    see [Note: The MPICH wheel needs srun --mpi=pmi2]."""
    environ = os.environ if environ is None else environ
    if environ.get("MPI4PY_MPIABI", "mpich").lower() not in ("mpich", "impi"):
        return None
    if prefixes is None:
        import site

        prefixes = list(dict.fromkeys([sys.exec_prefix, getattr(site, "USER_BASE", None) or sys.exec_prefix,
                                       sys.base_exec_prefix]))
    lib = _mpi4py_libmpi(prefixes, environ)
    if lib is None or os.path.realpath(lib) not in _wheel_libmpi():
        return None
    return f"mpi4py here loads the MPICH wheel ({lib}, pip package mpich)"


def _pmi2_warning(mpi, launcher, environ=None) -> str | None:
    """The one-line warning `slurm render` prints for a srun job left to the site's MpiDefault, or None."""
    if launcher != "srun" or mpi != "default":
        return None
    environ = os.environ if environ is None else environ
    why = mpi_needs_pmi2(environ=environ)
    if why is None:
        return None
    site = _site_mpi_default(environ)
    if site == "pmi2":
        return None
    where = f"MpiDefault={site} in this machine's slurm.conf" if site else "which may differ; not readable here"
    return (f"hpcfsdp slurm render: warning: {why}, which srun starts only with --mpi=pmi2; the script leaves "
            f"srun's --mpi to the site's MpiDefault ({where}): render with --mpi pmi2")


def _positive_int(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def _check_job(nodes, gpus_per_node, ntasks_per_node, cpus_per_task, time, choices, names) -> int:
    """Validate the job's Slurm settings (ConfigError naming the field); returns ntasks_per_node resolved."""
    for name, value in (("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "nodes" else 0):
            raise ConfigError(f"{name}={value!r}: expected an integer >= {1 if name == 'nodes' else 0}")
    if ntasks_per_node is None:
        ntasks_per_node = gpus_per_node if gpus_per_node > 0 else 1
    if not _positive_int(ntasks_per_node):
        raise ConfigError(f"ntasks_per_node={ntasks_per_node!r}: expected a positive integer")
    if gpus_per_node > 0 and ntasks_per_node > gpus_per_node:
        raise ConfigError(
            f"ntasks_per_node={ntasks_per_node}: expected <= gpus_per_node={gpus_per_node} (one GPU per rank)"
        )
    if cpus_per_task is not None and not _positive_int(cpus_per_task):
        raise ConfigError(f"cpus_per_task={cpus_per_task!r}: expected a positive integer")
    allowed = {"mpi": MPI_PLUGINS, "launcher": LAUNCHERS, "entry": ENTRIES, "cuda_aware": ("auto", "0", "1")}
    for name, value in choices.items():
        if value not in allowed[name]:
            raise ConfigError(f"{name}={value!r}: expected one of {', '.join(allowed[name])}")
    if not _TIME_RE.match(str(time)):
        raise ConfigError(f"time={time!r}: expected a Slurm time limit such as 30, 01:00:00 or 1-12:00:00")
    patterns = {"job_name": _NAME_RE, "output": _NAME_RE, "partition": _LIST_RE, "account": _NAME_RE,
                "qos": _NAME_RE, "constraint": _LIST_RE}
    for name, value in names.items():
        if value is not None and not patterns[name].match(str(value).replace("/", "")):
            raise ConfigError(f"{name}={value!r}: expected no spaces or shell characters")
    return ntasks_per_node


def _resolve_config(template, cfg, explicit, nodes, gpus_per_node, ntasks_per_node, mesh_auto) -> str:
    """The template to fill, and ``cfg`` (changed in place) as it implies: strategy, mesh, device."""
    if template is None:
        if cfg.strategy == "HYBRID_SHARD":
            template = "hsdp"
        else:
            template = "single-node" if nodes == 1 else "multi-node"
    if template not in TEMPLATES:
        raise ConfigError(f"template={template!r}: expected one of {', '.join(TEMPLATES)}")
    if template == "single-node" and nodes != 1:
        raise ConfigError(f"nodes={nodes}: template single-node runs on exactly 1 node (use multi-node or hsdp)")
    if template == "hsdp":
        if cfg.strategy != "HYBRID_SHARD":
            if "strategy" in explicit:
                raise ConfigError(f"strategy={cfg.strategy!r}: template hsdp runs HYBRID_SHARD")
            cfg.strategy = "HYBRID_SHARD"
    elif template != "bench-comm" and cfg.strategy == "HYBRID_SHARD":
        raise ConfigError(f"strategy='HYBRID_SHARD': use --template hsdp, not {template}")
    if mesh_auto or ("mesh" not in explicit and cfg.mesh is None):
        cfg.mesh = (nodes, ntasks_per_node) if cfg.strategy == "HYBRID_SHARD" else None
    if "device" not in explicit:
        cfg.device = "cuda" if gpus_per_node > 0 else "cpu"
    elif cfg.device == "cuda" and gpus_per_node == 0:
        raise ConfigError("device='cuda': needs --gpus-per-node >= 1")
    elif cfg.device == "cpu" and gpus_per_node > 0:
        raise ConfigError(f"device='cpu': the job requests --gpus-per-node {gpus_per_node}; use --device cuda "
                          f"or --gpus-per-node 0")
    if template != "bench-comm":
        cfg.validate(nodes * ntasks_per_node)
    return template


def _extra_directives(cpus_per_task, exclusive, **options) -> list:
    """#SBATCH lines for the optional settings that were given."""
    extra = []
    if cpus_per_task is not None:
        extra.append(f"#SBATCH --cpus-per-task={cpus_per_task}")
    for opt, value in options.items():
        if value is not None:
            extra.append(f"#SBATCH --{opt}={value}")
    if exclusive:
        extra.append("#SBATCH --exclusive")
    return extra


def _env_setup(mpi, gpus_per_node, cuda_aware, python="python3") -> list:
    """The script's environment lines: Python, threads per rank, GPU support of the MPI."""
    env = [
        f'PYTHON="${{PYTHON:-{shlex.quote(python)}}}"',
        'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
        'export OPENBLAS_NUM_THREADS="$OMP_NUM_THREADS"',
        'export MKL_NUM_THREADS="$OMP_NUM_THREADS"',
        'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"',
    ]
    if mpi == "cray_shasta" and gpus_per_node > 0:
        env.append("export MPICH_GPU_SUPPORT_ENABLED=1  # HPE Cray MPICH: accept GPU buffers")
    else:
        env.append("# export MPICH_GPU_SUPPORT_ENABLED=1  # HPE Cray MPICH with GPUs (render with --mpi cray_shasta)")
    if cuda_aware != "auto":
        env.append(f"export HPCFSDP_CUDA_AWARE={cuda_aware}")
    else:
        env.append("# export HPCFSDP_CUDA_AWARE=1  # skip the probe: 1 = MPI takes GPU buffers, 0 = stage via host")
    return env


def _mpiexec_of(python) -> str:
    """The mpiexec installed next to `python` (a venv with the MPICH wheel: the MPI mpi4py uses), else `mpiexec`
    from PATH, which in a batch job is often another MPI's or none."""
    if os.path.isabs(python):
        path = os.path.join(os.path.dirname(python), "mpiexec")
        if os.access(path, os.X_OK):
            return shlex.quote(path)
    return "mpiexec"


def _launch_words(launcher, mpi, nodes, ntasks_per_node, template, mpiexec="mpiexec", restartable=False) -> list:
    """srun (with the MPI plugin and block distribution for HSDP) or mpiexec inside the allocation; with a rerun's
    options if ``restartable`` (see [Note: Node failures in a Slurm job])."""
    if restartable:
        return _slurm_restart.launch_words(_launch_words(launcher, mpi, nodes, ntasks_per_node, template, mpiexec),
                                           launcher)
    if launcher == "srun":
        launch = ["srun"]
        if mpi != "default":
            launch.append(f"--mpi={mpi}")
        launch += [f"--nodes={nodes}", f"--ntasks-per-node={ntasks_per_node}", "--kill-on-bad-exit=1"]
        if template == "hsdp":
            launch.append("--distribution=block")
        return launch
    # MPICH Hydra inside the allocation; Open MPI: mpiexec -n N --map-by ppr:P:node
    return [mpiexec, "-n", str(nodes * ntasks_per_node), "-ppn", str(ntasks_per_node)]


EXAMPLE_WORKDIR = "/path/to/workdir"  # where the examples in slurm/ were rendered (their paths' base)


def render_examples() -> dict:
    """The scripts kept in the repository's slurm/ directory: file name -> text."""
    kw = dict(gpus_per_node=4, workdir=EXAMPLE_WORKDIR)
    return {
        "single_node.sbatch": render_script("single-node", nodes=1, **kw),
        "multi_node_fsdp.sbatch": render_script("multi-node", nodes=2, **kw),
        "multi_node_hsdp.sbatch": render_script("hsdp", nodes=2, **kw),
        "bench_comm.sbatch": render_script("bench-comm", nodes=2, **kw),
    }


# ------------------------------------------------------------------------ command line


def add_parser(subparsers):
    p = subparsers.add_parser(
        "slurm",
        help="render sbatch job scripts",
        description="Render sbatch job scripts for hpcfsdp from templates and the trainer's configuration.",
    )
    sub = p.add_subparsers(dest="slurm_command", metavar="ACTION")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    ls = sub.add_parser("list", help="list the templates", description="List the sbatch templates.")
    ls.set_defaults(func=_run_list)

    r = sub.add_parser(
        "render",
        help="print a filled sbatch script",
        description="Print an sbatch script that runs `hpcfsdp train` (or `bench comm`) with the given "
        "configuration, validated for the job's world size (nodes x ranks per node). "
        "--mesh auto (the default for HYBRID_SHARD) makes a (nodes x ranks per node) mesh. "
        "Example: hpcfsdp slurm render --nodes 2 --gpus-per-node 4 --strategy HYBRID_SHARD > job.sbatch",
    )
    j = r.add_argument_group("job")
    j.add_argument("--template", choices=tuple(TEMPLATES), default=None,
                   help="template (default: single-node for 1 node, hsdp for HYBRID_SHARD, else multi-node)")
    j.add_argument("--nodes", type=int, default=1, help="nodes (default: 1)")
    j.add_argument("--gpus-per-node", type=int, default=4, help="GPUs per node; 0 = CPU-only job (default: 4)")
    j.add_argument("--ntasks-per-node", type=int, default=None,
                   help="ranks per node (default: --gpus-per-node, or 1 for CPU-only)")
    j.add_argument("--cpus-per-task", type=int, default=None, help="CPU cores per rank (default: Slurm's)")
    j.add_argument("--partition", default=None, help="Slurm partition")
    j.add_argument("--account", default=None, help="Slurm account to charge")
    j.add_argument("--qos", default=None, help="Slurm quality of service")
    j.add_argument("--constraint", default=None, help="node features, e.g. gpu&a100")
    j.add_argument("--time", default="00:30:00", help="time limit (default: 00:30:00)")
    j.add_argument("--job-name", default=None, help="job name (default: hpcfsdp-<template>)")
    j.add_argument("--sbatch-output", default="%x-%j.out", help="sbatch --output pattern (default: %%x-%%j.out)")
    j.add_argument("--exclusive", action="store_true", help="request whole nodes")
    j.add_argument("--mpi", choices=MPI_PLUGINS, default="default",
                   help="srun --mpi plugin; 'default' leaves the site's MpiDefault (default: default)")
    j.add_argument("--launcher", choices=LAUNCHERS, default="srun", help="srun, or mpiexec (MPICH Hydra) (default: srun)")
    j.add_argument("--entry", choices=ENTRIES, default="module",
                   help="module: \"$PYTHON\" -m mpi4py -m hpcfsdp.cli.main; script: the hpcfsdp command (default: module)")
    j.add_argument("--cuda-aware", choices=("auto", "0", "1"), default="auto",
                   help="export HPCFSDP_CUDA_AWARE (default: auto = probe at run time)")
    j.add_argument("--signal-seconds", type=int, default=120,
                   help="Slurm sends USR1 this long before the time limit; the job checkpoints and stops "
                   "(--requeue: and is requeued) (default: 120)")
    j.add_argument("--max-restarts", type=int, default=2,
                   help="a training step that loses nodes is rerun without them, resuming from the newest "
                   "checkpoint, up to K times (0: never) (default: 2)")
    j.add_argument("--bench-args", default="", help="arguments for `hpcfsdp bench comm` (bench-comm template)")
    j.add_argument("--setup", action="append", default=[], metavar="COMMANDS",
                   help="site setup run in the batch script before the launch, e.g. \"module load mpich; source "
                   "~/venv/bin/activate\" (repeatable: one line each; checked with bash -n)")
    # The `hpcfsdp train` flags, in their groups; here --mesh also takes 'auto'.
    add_config_arguments(r)
    r.set_defaults(func=_run_render)


def _run_list(args) -> int:
    width = max(len(n) for n in TEMPLATES)
    for name, (fname, desc) in TEMPLATES.items():
        print(f"{name:<{width}}  {fname:<24}  {desc}")
    return 0


def _run_render(args) -> int:
    prog = "hpcfsdp slurm render"
    ns = argparse.Namespace(**vars(args))
    mesh_auto = isinstance(getattr(ns, "mesh", None), str) and ns.mesh.strip().lower() == "auto"
    if mesh_auto:
        del ns.mesh
    try:
        cfg = config_from_args(ns)
        explicit = {k for k in vars(cfg) if k in vars(ns)}
        if getattr(ns, "config", None):
            explicit |= set(load_config_file(ns.config))
        text = render_script(
            args.template, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
            ntasks_per_node=args.ntasks_per_node, config=cfg, config_explicit=explicit, mesh_auto=mesh_auto,
            partition=args.partition, account=args.account, time=args.time, job_name=args.job_name,
            output=args.sbatch_output, cpus_per_task=args.cpus_per_task, exclusive=args.exclusive,
            qos=args.qos, constraint=args.constraint, mpi=args.mpi, launcher=args.launcher, entry=args.entry,
            cuda_aware=args.cuda_aware, bench_args=args.bench_args, python=sys.executable,
            signal_seconds=args.signal_seconds, setup=args.setup, max_restarts=args.max_restarts,
            min_ranks=cfg.min_ranks,  # the train flag --min-ranks: below it the job requeues itself
        )
    except ConfigError as err:
        return exit_with_config_error(err, prog)
    warning = _pmi2_warning(args.mpi, args.launcher)
    if warning:
        print(warning, file=sys.stderr)
    sys.stdout.write(text)
    return 0
