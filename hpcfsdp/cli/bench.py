"""`hpcfsdp bench`: collective sweeps (comm), FSDP training steps (train), side-by-side comparisons (compare)."""

__all__ = ["add_parser"]


def add_parser(subparsers):
    p = subparsers.add_parser(
        "bench",
        help="benchmarks: collectives, training steps, comparisons with PyTorch",
        description="Benchmarks. Run under MPI (`hpcfsdp launch -n N -- hpcfsdp bench ...`) except `compare`, "
        "which launches its own runs.",
    )
    sub = p.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    from . import bench_comm, bench_train

    bench_comm.add_parser(sub)
    bench_train.add_parser(sub)
    bench_train.add_compare_parser(sub)
    bench_train.add_checkpoint_parser(sub)
