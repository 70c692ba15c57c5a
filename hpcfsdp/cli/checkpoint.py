"""`hpcfsdp checkpoint`: inspect, verify, consolidate and export (Hugging Face layout) sharded checkpoint directories."""

import argparse
import json
import os
import sys

__all__ = ["add_parser", "run_inspect", "run_verify", "run_consolidate", "run_export", "export_hf", "main"]


def add_parser(subparsers):
    p = subparsers.add_parser(
        "checkpoint",
        help="inspect, verify, consolidate or export (Hugging Face layout) a sharded checkpoint",
        description="Work on a checkpoint directory written by hpcfsdp.distributed.checkpoint "
        "(metadata.json + one safetensors file per rank). No MPI needed.",
    )
    sub = p.add_subparsers(dest="checkpoint_command", metavar="SUBCOMMAND", required=True)
    q = sub.add_parser("inspect", help="step, world size, model, date and size; entries with --entries",
                       description="Print what a checkpoint holds: its step, world size, model configuration, "
                       "when it was saved and its size on disk, then (--entries) one line per entry with its "
                       "shape, dtype, pieces, ranks and size. Reads metadata.json only.")
    q.add_argument("dir", metavar="DIR", help="checkpoint directory")
    q.add_argument("--entries", action="store_true", help="also list every entry (one line each)")
    q.add_argument("--json", action="store_true",
                   help="print the metadata as JSON, with the header under \"summary\" (for scripts)")
    q.set_defaults(func=_quiet_on_closed_pipe(run_inspect))
    q = sub.add_parser("verify", help="check every file, header and checksum",
                       description="Read every byte of every shard file and check it against metadata.json. "
                       "Exit status 1 with the reason on the first fault.")
    q.add_argument("dir", metavar="DIR", help="checkpoint directory")
    q.set_defaults(func=run_verify)
    q = sub.add_parser("consolidate", help="write the entries, unsharded, to safetensors files",
                       description="Assemble every entry in full from its pieces and write safetensors files "
                       "(extras and mesh as JSON in each file's metadata). A training checkpoint is split: "
                       "model weights to OUT under their parameter names, optimizer state to --optim-out "
                       "(default OUT with .optim before its suffix). Other checkpoints go whole to OUT.")
    q.add_argument("dir", metavar="DIR", help="checkpoint directory")
    q.add_argument("out", metavar="OUT.safetensors", help="output file (the model weights)")
    q.add_argument("--optim-out", metavar="FILE", default=None, help="output file for the optimizer state")
    q.set_defaults(func=run_consolidate)
    q = sub.add_parser("export", help="write an `hpcfsdp train` checkpoint as a Hugging Face model directory",
                       description="Assemble the model of a training checkpoint (GPT or Llama, any world size) and "
                       "write it in Hugging Face layout with the model's save_pretrained: config.json and "
                       "model.safetensors under transformers' names (GPT2LMHeadModel / LlamaForCausalLM), plus "
                       "tokenizer.json when the checkpoint carries a BPE tokenizer. config.json keeps the fields of "
                       "the --init-from directory's that the model does not define (token ids, use_cache...).")
    q.add_argument("--hf", required=True, metavar="OUT_DIR", help="the Hugging Face directory to write")
    q.add_argument("dir", metavar="CKPT", help="checkpoint directory (CHECKPOINT_DIR/latest or a step)")
    q.set_defaults(func=run_export)
    return p


def _quiet_on_closed_pipe(fn):
    """fn, ending quietly when the reader of stdout goes away (`hpcfsdp checkpoint inspect --json | head`)."""
    def run(args) -> int:
        try:
            code = fn(args)
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            # Python would report the pipe again when it flushes stdout at exit: point stdout at /dev/null.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 0

    return run


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def _fail(what: str, e: Exception) -> int:
    print(f"hpcfsdp checkpoint {what}: error: {e}", file=sys.stderr)
    return 1


def run_inspect(args) -> int:
    from hpcfsdp.distributed.checkpoint import _format

    try:
        md = _format.read_metadata(args.dir)
    except ValueError as e:
        return _fail("inspect", e)
    from . import _checkpoint_summary

    head = _checkpoint_summary.summary(md, args.dir)
    if args.json:
        print(json.dumps({**md.to_json(), "summary": head}, indent=1, sort_keys=True))
        return 0
    print("\n".join(_checkpoint_summary.summary_lines(md, head, _fmt_bytes)))
    if not getattr(args, "entries", False):
        return 0
    width = max((len(n) for n in md.entries), default=4)
    for name, e in md.entries.items():
        ranks = sorted({p.rank for p in e.pieces})
        shown = ",".join(map(str, ranks)) if len(ranks) <= 16 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)})"
        print(f"  {name:<{width}}  {e.dtype.name:<9} {str(list(e.shape)):<18} {len(e.pieces):>4} piece(s)  "
              f"ranks [{shown}]  {_fmt_bytes(e.nbytes)}")
    return 0


def run_verify(args) -> int:
    from hpcfsdp.distributed.checkpoint import _format

    try:
        md = _format.verify_checkpoint(args.dir)
    except ValueError as e:
        return _fail("verify", e)
    npieces = sum(len(e.pieces) for e in md.entries.values())
    print(f"OK: {len(md.entries)} entries, {npieces} pieces in {len(md.files)} file(s), "
          f"{md.total_bytes} bytes verified")
    return 0


def run_consolidate(args) -> int:
    from hpcfsdp.distributed.checkpoint import _format

    try:
        written = _format.consolidate(args.dir, args.out, args.optim_out)
    except (ValueError, TypeError, OSError) as e:
        return _fail("consolidate", e)
    print("wrote " + ", ".join(written))
    return 0


def run_export(args) -> int:
    from hpcfsdp.distributed.checkpoint import _format

    from .generate import load_checkpoint

    try:
        skeleton = (_format.read_metadata(args.dir).extras or {}).get("skeleton") or {}
        model, _, _ = load_checkpoint(args.dir)
        written = export_hf(model, skeleton, args.hf)
    except (ValueError, TypeError, KeyError, OSError) as e:
        return _fail("export", e)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {', '.join(written)} ({type(model).__name__}, {n} parameters)")
    return 0


def export_hf(model, skeleton, out) -> list:
    """Write ``model`` to Hugging Face directory ``out``: save_pretrained, then config.json merged over the
    fields of the --init-from config.json the checkpoint kept, and the checkpoint's BPE tokenizer.json."""
    model.save_pretrained(out)
    cfg_file = os.path.join(out, "config.json")
    with open(cfg_file) as f:
        config = json.load(f)
    tok = skeleton.get("tokenizer")
    base = dict(skeleton.get("hf_config") or {})
    if isinstance(tok, dict) and tok.get("eot_id") is not None:  # GPT-2's convention: <|endoftext|> begins and ends
        base.setdefault("bos_token_id", tok["eot_id"])
        base.setdefault("eos_token_id", tok["eot_id"])
    with open(cfg_file, "w") as f:
        json.dump({**base, **config}, f, indent=2, sort_keys=True)
        f.write("\n")
    written = [cfg_file, os.path.join(out, "model.safetensors")]
    if isinstance(tok, dict) and tok.get("type") == "bpe" and isinstance(tok.get("json"), str):
        written.append(os.path.join(out, "tokenizer.json"))
        with open(written[-1], "w", encoding="utf-8") as f:
            f.write(tok["json"])
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hpcfsdp")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
