"""`hpcfsdp info`: what MPI, GPUs and capabilities this job sees, and how each was decided."""

import json
import sys

__all__ = ["add_parser", "run"]


def add_parser(subparsers):
    p = subparsers.add_parser(
        "info",
        help="print the MPI / GPU capability probe",
        description="Print the MPI vendor, thread level, node layout, CUDA-awareness (and how it was "
        "decided), half-precision MPI types and CuPy/GPU availability. Run it under mpiexec/srun "
        "to see the job's layout.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--all-ranks", action="store_true", help="print the probe of every rank (default: rank 0 only)")
    p.set_defaults(func=run)


def _text(info: dict) -> str:
    lines = []
    for key, value in info.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines.extend(f"  {k}: {v}" for k, v in value.items())
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def run(args) -> int:
    from hpcfsdp.distributed import _mpi

    info = _mpi.probe()
    comm = _mpi.get_mpi().COMM_WORLD
    if args.all_ranks:
        everyone = comm.gather(info, root=0)
        if comm.rank == 0:
            if args.json:
                print(json.dumps(everyone, indent=2))
            else:
                print("\n\n".join(f"[rank {i}]\n{_text(x)}" for i, x in enumerate(everyone)))
    elif comm.rank == 0:
        print(json.dumps(info, indent=2) if args.json else _text(info))
        if not args.json and info.get("cupy") and info.get("cupy_bfloat16") is False:
            print(f"warning: the installed CuPy lacks bfloat16 ({info['cupy_bfloat16_note']})")
    sys.stdout.flush()
    return 0
