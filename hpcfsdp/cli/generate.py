"""`hpcfsdp generate`: sample text from a Hugging Face directory or an `hpcfsdp train` checkpoint."""
import argparse
import json
import os
import sys

__all__ = ["add_parser", "load_model", "load_checkpoint", "main"]


def add_parser(subparsers):
    p = subparsers.add_parser(
        "generate", help="sample text from a trained model",
        description="Sample continuations of a prompt. CHECKPOINT is a Hugging Face model directory (config.json "
        "+ safetensors: GPT-2 or Llama) or a checkpoint written by `hpcfsdp train` (its latest/ or step "
        "directory). Text is encoded with the tokenizer the checkpoint carries (`hpcfsdp train` saves the one "
        "its --data was prepared with), the directory's tokenizer.json (Hugging Face `tokenizers`), or the one "
        "given with --tokenizer; else as bytes.")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=200, help="sample among the k most likely tokens; 0 = all")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--tokenizer", default=None, metavar="FILE",
                   help="a tokenizer.json; default: the checkpoint's own (CHECKPOINT/tokenizer.json for a Hugging Face "
                   "directory), else bytes")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.set_defaults(func=run)


def load_model(path, device="cpu"):
    """(model, source): a GPT or Llama from a Hugging Face directory or an `hpcfsdp train` checkpoint."""
    model, source, _ = load_checkpoint(path, device)
    return model, source


def load_checkpoint(path, device="cpu"):
    """(model, source, tokenizer): the model of a Hugging Face directory or an `hpcfsdp train` checkpoint, and the
    tokenizer that comes with it (a LoadedTokenizer; None when it carries none). See [Note: Tokenizer with the
    checkpoint] in hpcfsdp/data/tokenizer_spec.py."""
    from hpcfsdp.data.tokenizer_spec import load_tokenizer, tokenizer_from_file
    from hpcfsdp.models import GPT, Llama

    cfg_file = os.path.join(path, "config.json")
    if os.path.exists(cfg_file):
        with open(cfg_file) as f:
            kind = json.load(f).get("model_type")
        cls = {"gpt2": GPT, "llama": Llama}.get(kind)
        if cls is None:
            raise ValueError(f"{cfg_file}: model_type {kind!r} is not supported (gpt2 or llama)")
        tok_file = os.path.join(path, "tokenizer.json")
        tok = tokenizer_from_file(tok_file) if os.path.exists(tok_file) else None
        return cls.from_pretrained(path, device=device), "huggingface", tok
    from hpcfsdp.distributed import checkpoint as dcp

    from ._model import model_from_saved

    try:
        md = dcp.read_metadata(path)
    except Exception as e:  # noqa: BLE001 - reported with the path
        raise ValueError(f"{path}: neither a Hugging Face directory (config.json) nor an hpcfsdp checkpoint ({e})") \
            from None
    skeleton = (md.extras or {}).get("skeleton") or {}
    try:
        model = model_from_saved(skeleton)
    except ValueError as e:
        raise ValueError(f"{path} {e}") from None
    state = {"model": model.state_dict()}  # detached views of the parameters: filled in place
    dcp.load(state, checkpoint_id=path, strict=False)
    spec = skeleton.get("tokenizer")
    tok = load_tokenizer(spec) if spec is not None else None
    return (model.to(device) if device != "cpu" else model), "hpcfsdp", tok


def _byte_tokenizer():
    from hpcfsdp.data.tokenizer_spec import load_tokenizer

    return load_tokenizer({"type": "byte"})


def _say(message) -> int:
    print(f"hpcfsdp generate: {message}", file=sys.stderr)
    return 1


def run(args) -> int:

    import hpcfsdp as hp
    from hpcfsdp.data.tokenizer_spec import tokenizer_from_file

    try:
        model, _, tok = load_checkpoint(args.checkpoint, "cuda:0" if args.device == "cuda" else "cpu")
        if args.tokenizer:
            tok = tokenizer_from_file(args.tokenizer)
    except (ValueError, KeyError, FileNotFoundError, TypeError) as e:
        return _say(e)
    carried = tok is not None
    tok = tok or _byte_tokenizer()
    if tok.vocab_size > model.config.vocab_size:
        return _say(f"the tokenizer has {tok.vocab_size} tokens but the model only {model.config.vocab_size}")
    model.eval()
    ids = tok.encode(args.prompt)
    if ids.size == 0:
        print("hpcfsdp generate: the prompt encodes to no tokens", file=sys.stderr)
        return 2
    hp.manual_seed(args.seed)
    x = hp.tensor(ids[None, :], device=model.lm_head.weight.device)
    for i in range(args.num_samples):
        out = model.generate(x, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k or None)
        try:
            text = tok.decode(hp._backend.to_numpy(out[0]._data))
        except ValueError as e:  # the model's vocabulary is larger than the tokenizer's
            hint = "" if carried else (f"; {args.checkpoint} carries no tokenizer, so bytes were assumed: pass "
                                       "--tokenizer FILE (the tokenizer.json `hpcfsdp data prepare` wrote)")
            return _say(f"{e}; the model's vocabulary is {model.config.vocab_size}{hint}")
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        print(text, flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hpcfsdp")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
