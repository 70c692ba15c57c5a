"""`hpcfsdp data prepare`: tokenize text files into token shards with sidecars (byte-level BPE or bytes)."""
import argparse
import fnmatch
import json
import os
import sys

__all__ = ["add_parser", "prepare", "main"]

EOT = "<|endoftext|>"
_CHUNK = 1 << 20  # characters tokenized at once (cut at a line end), so no file is held twice in memory


def add_parser(subparsers):
    p = subparsers.add_parser("data", help="prepare training data (tokenize text into token shards)")
    sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)
    q = sub.add_parser(
        "prepare", help="tokenize text files into token shards",
        description="Tokenize UTF-8 text files (or directories of them) into OUT/shard_NNNNN.bin token files, each "
        "with a .json sidecar giving its dtype and vocabulary, that `hpcfsdp train --data OUT` memory-maps. "
        "--tokenizer bpe trains a byte-level BPE on the inputs with Hugging Face `tokenizers` (pip install "
        "tokenizers) and saves it as OUT/tokenizer.json; --tokenizer byte uses UTF-8 bytes (vocabulary 256). "
        "Documents are separated by an end-of-text token (BPE) or nothing (bytes).")
    q.add_argument("inputs", nargs="*", metavar="PATH", help="text files or directories (searched recursively)")
    q.add_argument("--python-stdlib", action="store_true",
                   help="add this Python's standard library sources (an offline corpus of tens of MB; "
                   "with --max-bytes to take a part)")
    q.add_argument("--out", required=True, metavar="DIR", help="output directory (created)")
    q.add_argument("--tokenizer", choices=["bpe", "byte"], default="bpe")
    q.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size (byte: always 256)")
    q.add_argument("--pattern", default="*.txt,*.py,*.rst,*.md",
                   help="comma-separated file-name patterns for files found in directories")
    q.add_argument("--shard-tokens", type=int, default=1 << 24, help="at most this many tokens per shard")
    q.add_argument("--max-bytes", type=int, default=0, help="stop after this many input bytes (0 = all)")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.set_defaults(func=run)


def _files(inputs, patterns, max_bytes):
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    out, total = [], 0
    for inp in inputs:
        if os.path.isdir(inp):
            found = []
            for d, dirs, names in os.walk(inp):
                dirs.sort()
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


def _train_bpe(files, vocab_size, out_dir, progress):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise SystemExit("hpcfsdp data prepare --tokenizer bpe needs Hugging Face `tokenizers` "
                         "(pip install 'hpcfsdp[data]' or pip install tokenizers)") from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def texts():
        for f in files:
            t = _read_text(f)
            if t is not None:
                yield from _chunks(t)

    tok.train_from_iterator(texts(), trainer=trainer)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    return tok, path


def prepare(inputs, out_dir, *, tokenizer="bpe", vocab_size=4096, pattern="*.txt,*.py,*.rst,*.md",
            shard_tokens=1 << 24, max_bytes=0, progress=True) -> dict:
    """Tokenize ``inputs`` into ``out_dir``; returns a summary (also written to OUT/prepare.json)."""
    import numpy as np
    from tqdm import tqdm

    from hpcfsdp.data.tokenfile import TokenFileWriter
    from hpcfsdp.data.tokenizer import VOCAB_SIZE

    if shard_tokens < 2:
        raise ValueError(f"shard_tokens must be >= 2, got {shard_tokens}")
    files = _files(inputs, pattern, max_bytes)
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
    total = sum(os.path.getsize(f) for f in files)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="tokenizing", disable=not progress, file=sys.stderr)

    def new_writer():
        path = os.path.join(out_dir, f"shard_{len(shards):05d}.bin")
        shards.append(path)
        return TokenFileWriter(path, vocab_size=vocab, tokenizer=info)

    try:
        for f in files:
            text = _read_text(f)
            bar.update(os.path.getsize(f))
            if text is None:
                skipped.append(f)
                continue
            ids = encode(text)
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
    inputs = list(args.inputs) + ([stdlib_dir()] if args.python_stdlib else [])
    if not inputs:
        print("hpcfsdp data prepare: no inputs (give PATHs or --python-stdlib)", file=sys.stderr)
        return 2
    try:
        s = prepare(inputs, args.out, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
                    pattern=args.pattern, shard_tokens=args.shard_tokens, max_bytes=args.max_bytes,
                    progress=not args.no_progress)
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
