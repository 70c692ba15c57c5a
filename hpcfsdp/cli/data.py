"""`hpcfsdp data prepare`: tokenize text files into token shards with sidecars (byte-level BPE or bytes)."""
import argparse
import fnmatch
import json
import os
import sys

__all__ = ["add_parser", "prepare", "estimate_seconds", "main", "PROGRESS_ENV"]

EOT = "<|endoftext|>"
_CHUNK = 1 << 20  # characters tokenized at once (cut at a line end), so no file is held twice in memory
PROGRESS_ENV = "HPCFSDP_PROGRESS"  # 0: no progress bars (as for `hpcfsdp train`)
# Measured on a shared 2-core machine (RAYON_NUM_THREADS=1): CPython 3.11's standard library without
# site-packages is 1875 files, 30.5 MiB of the default patterns; `prepare --python-stdlib` took 30 s wall (21 s
# CPU: BPE training 12 s, encoding 17 s) with the default 4096-token BPE and 0.7 s with --tokenizer byte.
STDLIB_SIZE = "about 30 MiB of text in some 1900 files for CPython 3.11"
STDLIB_TIME = "about 30-40 s on one core with the default BPE, about 1 s with --tokenizer byte"
_MIB_PER_S = {"bpe": 0.9, "byte": 40.0}  # one core, train + encode + write, for the up-front estimate


def add_parser(subparsers):
    p = subparsers.add_parser("data", help="prepare training data (tokenize text into token shards)")
    sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)
    q = sub.add_parser(
        "prepare", help="tokenize text files into token shards",
        description="Tokenize UTF-8 text files (or directories of them) into OUT/shard_NNNNN.bin token files, each "
        "with a .json sidecar giving its dtype and vocabulary, that `hpcfsdp train --data OUT` memory-maps. "
        "--tokenizer bpe trains a byte-level BPE on the inputs with Hugging Face `tokenizers` (pip install "
        "tokenizers) and saves it as OUT/tokenizer.json; --tokenizer byte uses UTF-8 bytes (vocabulary 256). "
        "Documents are separated by an end-of-text token (BPE) or nothing (bytes). BPE takes about a second per "
        "MiB of text on one core (training, then encoding); a first line gives the corpus size and an estimate, "
        "and progress bars the time left.")
    q.add_argument("inputs", nargs="*", metavar="PATH", help="text files or directories (searched recursively)")
    q.add_argument("--python-stdlib", action="store_true",
                   help="add this Python's standard library sources, without site-packages (an offline corpus: "
                   f"{STDLIB_SIZE}; {STDLIB_TIME}); --max-bytes takes a part")
    q.add_argument("--out", required=True, metavar="DIR", help="output directory (created)")
    q.add_argument("--tokenizer", choices=["bpe", "byte"], default="bpe")
    q.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size (byte: always 256)")
    q.add_argument("--pattern", default="*.txt,*.py,*.rst,*.md",
                   help="comma-separated file-name patterns for files found in directories")
    q.add_argument("--shard-tokens", type=int, default=1 << 24, help="at most this many tokens per shard")
    q.add_argument("--max-bytes", type=int, default=0, help="stop after this many input bytes (0 = all)")
    q.add_argument("--no-progress", action="store_true",
                   help=f"no progress bars on stderr (also {PROGRESS_ENV}=0); by default they show, with an estimate "
                   "of the time left, terminal or not")
    q.set_defaults(func=run)


_NOT_STDLIB = ("site-packages", "dist-packages")  # installed packages: not the standard library, and vary by machine


def _files(inputs, patterns, max_bytes, prune=()):
    """The non-empty files of ``inputs`` (directories searched for ``patterns``, skipping the directories of
    ``prune``: (input, names) pairs), up to ``max_bytes`` in all."""
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    skip = dict(prune)
    out, total = [], 0
    for inp in inputs:
        if os.path.isdir(inp):
            found = []
            for d, dirs, names in os.walk(inp):
                dirs[:] = sorted(n for n in dirs if not (d == inp and n in skip.get(inp, ())))
                found += [os.path.join(d, n) for n in sorted(names) if any(fnmatch.fnmatch(n, p) for p in pats)]
        elif os.path.isfile(inp):
            found = [inp]
        else:
            raise FileNotFoundError(f"{inp}: no such file or directory")
        for f in found:
            if max_bytes and total >= max_bytes:
                return out
            size = os.path.getsize(f)
            if size:
                out.append(f)
                total += size
    if not out:
        raise ValueError(f"no non-empty input files in {inputs} (patterns {pats})")
    return out


def _read_text(path):
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None  # skipped, and counted


def _chunks(text):
    i = 0
    while i < len(text):
        j = min(len(text), i + _CHUNK)
        if j < len(text):
            k = text.rfind("\n", i, j)
            j = k + 1 if k > i else j
        yield text[i:j]
        i = j


def _bar(progress, total, desc):
    from tqdm import tqdm

    # a terminal redraws in place; a log file gets a line every 10 s rather than a stream of redraws
    tty = sys.stderr.isatty()
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, disable=not progress,
                file=sys.stderr, dynamic_ncols=tty, mininterval=0.1 if tty else 10.0, ascii=not tty)


def _train_bpe(files, vocab_size, out_dir, progress):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise SystemExit("hpcfsdp data prepare --tokenizer bpe needs Hugging Face `tokenizers` "
                         "(pip install 'hpcfsdp[data]' or pip install tokenizers)") from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bar = _bar(progress, sum(os.path.getsize(f) for f in files), f"training BPE ({vocab_size} tokens)")

    def texts():  # the bar follows the bytes the trainer has taken; its merges come after the last
        for f in files:
            t = _read_text(f)
            if t is not None:
                yield from _chunks(t)
            bar.update(os.path.getsize(f))
        bar.set_postfix_str("computing merges", refresh=True)

    try:
        tok.train_from_iterator(texts(), trainer=trainer)
    finally:
        bar.close()
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    return tok, path


def estimate_seconds(n_bytes: int, tokenizer: str = "bpe") -> float:
    """About how long `prepare` takes on one core for ``n_bytes`` of text (measured rates; a guide, not a bound)."""
    return n_bytes / 2**20 / _MIB_PER_S[tokenizer]


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 else \
        f"{seconds / 3600:.1f} h"


def prepare(inputs, out_dir, *, tokenizer="bpe", vocab_size=4096, pattern="*.txt,*.py,*.rst,*.md",
            shard_tokens=1 << 24, max_bytes=0, progress=True, python_stdlib=False) -> dict:
    """Tokenize ``inputs`` (and, with ``python_stdlib``, this Python's standard library less site-packages) into
    ``out_dir``; returns a summary (also written to OUT/prepare.json). ``progress``: bars with the time left,
    and a line with the corpus size and an estimate first, on stderr."""
    import numpy as np

    from hpcfsdp.data.tokenfile import TokenFileWriter
    from hpcfsdp.data.tokenizer import VOCAB_SIZE

    if shard_tokens < 2:
        raise ValueError(f"shard_tokens must be >= 2, got {shard_tokens}")
    if tokenizer not in _MIB_PER_S:
        raise ValueError(f"tokenizer={tokenizer!r}: expected 'bpe' or 'byte'")
    inputs, prune = list(inputs), []
    if python_stdlib:
        inputs.append(stdlib_dir())
        prune.append((stdlib_dir(), _NOT_STDLIB))
    files = _files(inputs, pattern, max_bytes, prune)
    total = sum(os.path.getsize(f) for f in files)
    if progress:
        print(f"hpcfsdp data prepare: {len(files)} files, {total / 2**20:.1f} MiB of text: about "
              f"{_duration(estimate_seconds(total, tokenizer))} on one core ({PROGRESS_ENV}=0 or --no-progress: "
              "no bars)", file=sys.stderr, flush=True)
    os.makedirs(out_dir, exist_ok=True)
    if tokenizer == "bpe":
        if not 257 <= vocab_size <= 2 ** 32:
            raise ValueError(f"--vocab-size {vocab_size}: a byte-level BPE needs at least 257 tokens")
        tok, tok_path = _train_bpe(files, vocab_size, out_dir, progress)
        vocab = tok.get_vocab_size()
        eot = [tok.token_to_id(EOT)]
        info = {"type": "bpe", "file": "tokenizer.json", "eot_id": eot[0]}

        def encode(text):
            return np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch(list(_chunks(text)))])
    else:
        vocab, eot, tok_path = VOCAB_SIZE, [], None
        info = {"type": "byte"}

        def encode(text):
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    shards, skipped, n_tokens, writer = [], [], 0, None
    bar = _bar(progress, total, "tokenizing")

    def new_writer():
        path = os.path.join(out_dir, f"shard_{len(shards):05d}.bin")
        shards.append(path)
        return TokenFileWriter(path, vocab_size=vocab, tokenizer=info)

    try:
        for f in files:
            text = _read_text(f)
            if text is None:
                skipped.append(f)
                bar.update(os.path.getsize(f))
                continue
            ids = encode(text)
            bar.update(os.path.getsize(f))
            if eot:
                ids = np.concatenate([ids, np.asarray(eot, dtype=np.int64)])
            while ids.size:
                if writer is None:
                    writer = new_writer()
                room = shard_tokens - writer.num_tokens
                writer.write(ids[:room])
                n_tokens += min(room, ids.size)
                ids = ids[room:]
                if writer.num_tokens >= shard_tokens:
                    writer.close()
                    writer = None
        if writer is not None:
            writer.close()
    finally:
        bar.close()
    summary = {"files": len(files), "skipped_not_utf8": skipped, "bytes": total, "tokens": n_tokens,
               "vocab_size": vocab, "tokenizer": info, "shards": [os.path.basename(s) for s in shards],
               "tokenizer_file": tok_path}
    with open(os.path.join(out_dir, "prepare.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    return summary


def stdlib_dir() -> str:
    """This interpreter's standard library directory (Python sources and docs: an offline text corpus)."""
    import sysconfig

    return sysconfig.get_paths()["stdlib"]


def run(args) -> int:
    if not args.inputs and not args.python_stdlib:
        print("hpcfsdp data prepare: no inputs (give PATHs or --python-stdlib)", file=sys.stderr)
        return 2
    from hpcfsdp import _settings

    try:
        s = prepare(args.inputs, args.out, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
                    pattern=args.pattern, shard_tokens=args.shard_tokens, max_bytes=args.max_bytes,
                    progress=not args.no_progress and _settings.get(PROGRESS_ENV) is not False,
                    python_stdlib=args.python_stdlib)
    except (ValueError, FileNotFoundError) as e:
        print(f"hpcfsdp data prepare: {e}", file=sys.stderr)
        return 1
    print(f"{s['files']} files, {s['bytes'] / 2**20:.1f} MiB -> {s['tokens']} tokens in {len(s['shards'])} shard(s) "
          f"under {args.out} (vocabulary {s['vocab_size']}; train with --data {args.out} --vocab-size "
          f"{s['vocab_size']})" + (f"; {len(s['skipped_not_utf8'])} non-UTF-8 files skipped"
                                   if s["skipped_not_utf8"] else ""), flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hpcfsdp")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
