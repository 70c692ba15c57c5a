"""`hpcfsdp info`: what MPI, GPUs and capabilities this job sees, how each was decided, and the settings."""

import json
import sys

__all__ = ["add_parser", "run"]


def add_parser(subparsers):
    p = subparsers.add_parser(
        "info",
        help="print the MPI / GPU capability probe",
        description="Print the MPI vendor, thread level, node layout, CUDA-awareness (and how it was "
        "decided), half-precision MPI types, CuPy/GPU and NCCL availability, how collectives will move CuPy "
        "arrays (gpu_comm: nccl, CUDA-aware mpi or staged, and why), and the effective HPCFSDP_* "
        "settings (value, and whether set or the default). Run it under mpiexec/srun to see the job's layout.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--all-ranks", action="store_true",
                   help="print the probe of every rank (default: rank 0 only): what is the same on every rank "
                   "once, then what differs, grouped by rank ranges (--json: one report per rank)")
    p.set_defaults(func=run)


def _setting_value(row: dict) -> str:
    if "error" in row:
        return f"INVALID ({row['error']})"
    how = "set" if row["set"] else "default"
    return f"{row['value']!r} ({how}{', internal' if row.get('internal') else ''})"


def _setting_line(name: str, row: dict) -> str:
    return f"  {name}: {_setting_value(row)}"


def _all_ranks_text(everyone: list) -> str:
    """Every rank's probe: the same once, what differs grouped by ranks (see hpcfsdp/cli/_rank_groups.py)."""
    from ._rank_groups import grouped_lines

    return "\n".join(grouped_lines(everyone, lambda sec, v: _setting_value(v) if sec == "settings" else str(v)))


def _text(info: dict) -> str:
    lines = []
    for key, value in info.items():
        if key == "settings":
            lines.append("settings:")
            lines.extend(_setting_line(k, v) for k, v in value.items())
        elif isinstance(value, dict):
            lines.append(f"{key}:")
            lines.extend(f"  {k}: {v}" for k, v in value.items())
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def run(args) -> int:
    from hpcfsdp import _settings

    try:  # importing hpcfsdp.distributed already reads settings (the torchrun variables)
        from hpcfsdp.distributed import _mpi, _nccl

        nccl, nccl_why = _nccl.nccl_status()
        info = dict(_mpi.probe(), nccl=nccl_why if nccl is not None else f"unavailable: {nccl_why}",
                    gpu_comm=_nccl.auto_choice_text(), settings=_settings.effective())
    except ValueError as e:  # an HPCFSDP_* variable the probe reads does not parse: name it, show them all
        print(f"hpcfsdp info: error: {e}", file=sys.stderr)
        print(_text({"settings": _settings.effective()}))
        return 2
    comm = _mpi.get_mpi().COMM_WORLD
    if args.all_ranks:
        everyone = comm.gather(info, root=0)
        if comm.rank == 0:
            if args.json:
                print(json.dumps(everyone, indent=2))
            else:
                print(_all_ranks_text(everyone))
    elif comm.rank == 0:
        print(json.dumps(info, indent=2) if args.json else _text(info))
        if not args.json and info.get("cupy") and info.get("cupy_bfloat16") is False:
            print(f"warning: the installed CuPy lacks bfloat16 ({info['cupy_bfloat16_note']})")
    sys.stdout.flush()
    return 0
