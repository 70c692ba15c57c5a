"""The batch script's answer to a failed node: rerun the step without it, resuming, or requeue the job.

[Note: Node failures in a Slurm job]
A training template runs its step in a loop. When the step fails (any status but 0, STOPPED_EXIT and 130,
and no stop signal forwarded: see [Note: Forwarding the warning signal] in slurm.py), the script asks
which nodes of its allocation were lost: those a rank wrapper named for a rank killed by a signal
(`hpcfsdp: rank R (host H, pid P) killed by ...`: with --launcher mpiexec, see [Note: A rank under plain
mpiexec] in main.py, or a rank wrapper put in front of the program; srun's own "task R: Killed" lines are
not used, since srun SIGKILLs the tasks of healthy nodes too when they do not end in time), those
srun names in "Node failure on H", and those Slurm reports down, draining, failed or not responding
(`sinfo`). It then reruns the step on the allocation's other nodes (`srun --nodes=K --exclude=...`, which
override the first run's, or Hydra's `-n`/`-hosts`), at most --max-restarts times; `hpcfsdp train` resumes
from CHECKPOINT_DIR/latest (the rendered --resume-if-exists does that; a script rendered with --resume-from
CKPT gets `--resume-from CHECKPOINT_DIR/latest` on a rerun once it exists) and reshards it to the smaller
world, and an HSDP job whose mesh render chose gets the mesh of the nodes left. Where fewer than
--min-ranks ranks would remain, the script runs `scontrol requeue $SLURM_JOB_ID` (a requeued job gets a
whole allocation again and resumes); when the restarts are used up it stops. Either way it says why in one
line and exits with the step's status. A step that failed without losing a node (an exception) is not
rerun. `#SBATCH --no-kill` keeps the job alive when one of its nodes fails, so the script can do this.

The step's stderr passes through `tee` into a temporary file while it runs (the rank wrappers' lines), and
the script waits for tee to finish before it reads the file.
"""

import shlex

__all__ = ["SETUP", "check", "after_step", "launch_words"]

RERUN = '${rerun[@]+"${rerun[@]}"}'  # srun's (or mpiexec's) options of a rerun, after the first run's
AGAIN = '${again[@]+"${again[@]}"}'  # train's flags of a rerun, after the rendered ones

SETUP = """\
# On a failed node: rerun without it, resuming (see [Note: Node failures in a Slurm job] in hpcfsdp/cli/_slurm_restart.py)
nodes={nodes}; ranks={ranks}; restarts=0; exclude=; rerun=(); again=(); alloc=
steplog=$(mktemp "${{TMPDIR:-/tmp}}/hpcfsdp-step.XXXXXX")
trap 'rm -f "$steplog"' EXIT
lost_nodes() {{
    sed -n -e 's/^hpcfsdp: rank [0-9]* (host \\([^,.]*\\)[^,]*, pid [0-9]*) killed by .*/\\1/p' \\
        -e 's/.*srun: error: Node failure on \\([^ ,]*\\).*/\\1/p' "$steplog"
    if [ -n "${{SLURM_JOB_NODELIST:-}}" ] && command -v sinfo >/dev/null 2>&1; then
        sinfo -h -N -n "$SLURM_JOB_NODELIST" -t down,drain,draining,fail,failing,no_respond -o %N 2>/dev/null || true
    fi
}}
exec 3>&2
while :; do
: > "$steplog"
exec 2> >(tee -a "$steplog" >&3)
tee=$!
"""

_AFTER = """\
if [ "$status" -eq 0 ] || [ "$status" -eq {stopped} ] || [ "$status" -eq 130 ] || [ -n "$got" ] || [ {max_restarts} -eq 0 ]; then
    exit "$status"
fi
exec 2>&3
for _ in $(seq 50); do kill -0 "$tee" 2>/dev/null || break; sleep 0.1; done  # the step's last lines in $steplog
if [ -z "$alloc" ] && [ -n "${{SLURM_JOB_NODELIST:-}}" ]; then
    alloc=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | tr '\\n' ' ' || true)
fi
lost=
for n in $(lost_nodes | sort -u); do
    case " $alloc " in *" $n "*) ;; *) continue ;; esac
    case ",$exclude," in *",$n,"*) continue ;; esac
    lost="$lost${{lost:+,}}$n"
done
if [ -z "$lost" ]; then
    echo "hpcfsdp: the job step failed (exit $status) without losing a node of the allocation: not rerun"
    exit "$status"
fi
exclude="$exclude${{exclude:+,}}$lost"
left=; count=0
for n in $alloc; do
    case ",$exclude," in *",$n,"*) ;; *) left="$left${{left:+,}}$n"; count=$((count + 1)) ;; esac
done
if [ $((count * {per_node})) -lt {min_ranks} ]; then
    echo "hpcfsdp: lost node(s) $lost; $((count * {per_node})) rank(s) would remain, fewer than --min-ranks {min_ranks}: requeueing job ${{SLURM_JOB_ID:-?}}; exit $status"
    if [ -n "${{SLURM_JOB_ID:-}}" ]; then scontrol requeue "$SLURM_JOB_ID"; fi
    exit "$status"
fi
if [ "$restarts" -ge {max_restarts} ]; then
    echo "hpcfsdp: lost node(s) $lost; not rerun: --max-restarts {max_restarts} used up; exit $status"
    exit "$status"
fi
restarts=$((restarts + 1)); nodes=$count; ranks=$((count * {per_node}))
{rerun}
again=({again})
{resume_from}if [ -e {latest} ]; then from="resuming from "{latest}; else from="no checkpoint yet: from step 0"; fi
echo "hpcfsdp: restart $restarts/{max_restarts}: lost node(s) $lost; rerunning on $nodes node(s) x {per_node} rank(s) without $exclude, $from"
done
"""


def check(max_restarts, min_ranks, world_size) -> str:
    """ConfigError for bad restart settings; else the script's header lines about them ("" without restarts)."""
    from .config import ConfigError

    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ConfigError(f"max_restarts={max_restarts!r}: expected 0 or more restarts")
    if isinstance(min_ranks, bool) or not isinstance(min_ranks, int) or not 1 <= min_ranks <= world_size:
        raise ConfigError(f"min_ranks={min_ranks!r}: expected 1..{world_size} (the job's nodes x ranks per node)")
    if not max_restarts:
        return ""
    return (f"# Node failure: the step is rerun without the lost nodes, resuming from CHECKPOINT_DIR/latest,\n"
            f"#   up to {max_restarts} times (--max-restarts); below {min_ranks} rank(s) (--min-ranks) the job is "
            "requeued.\n")


def after_step(*, launcher, per_node, max_restarts, min_ranks, stopped, checkpoint_dir, resume_from, hsdp_mesh):
    """The lines after the step's status is known: exit, requeue, or rerun (the loop's end)."""
    rerun = ('rerun=(--nodes="$nodes" --exclude="$exclude")' if launcher == "srun" else 'rerun=(-hosts "$left")')
    latest = shlex.quote(f"{checkpoint_dir}/latest") if checkpoint_dir else "/nonexistent/hpcfsdp-latest"
    again = f'--mesh "${{nodes}}x{per_node}"' if hsdp_mesh else ""
    resume = (f"if [ -e {latest} ]; then again+=(--resume-from {latest}); fi\n"
              if resume_from is not None and checkpoint_dir else "")
    return _AFTER.format(stopped=stopped, max_restarts=max_restarts, per_node=per_node, min_ranks=min_ranks,
                         rerun=rerun, again=again, resume_from=resume, latest=latest)


def launch_words(words, launcher) -> list:
    """The launch line's words with a rerun's options: srun's come after the first run's (the last wins); Hydra
    refuses a second -n, so its count is the shell's $ranks."""
    if launcher == "srun":
        return [*words, RERUN]
    assert words[1] == "-n", words
    return [words[0], "-n", '"$ranks"', *words[3:], RERUN]
