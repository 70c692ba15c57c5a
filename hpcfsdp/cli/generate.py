"""`hpcfsdp generate`: sample text from a Hugging Face directory or an `hpcfsdp train` checkpoint."""
import argparse
import json
import os
import sys

__all__ = ["add_parser", "load_model", "main"]


def add_parser(subparsers):
    p = subparsers.add_parser(
        "generate", help="sample text from a trained model",
        description="Sample continuations of a prompt. CHECKPOINT is a Hugging Face model directory (config.json "
        "+ safetensors: GPT-2 or Llama) or a checkpoint written by `hpcfsdp train` (its latest/ or step "
        "directory). Text is encoded with the byte tokenizer, or with a tokenizer.json (Hugging Face "
        "`tokenizers`) found in the directory or given with --tokenizer.")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=200, help="sample among the k most likely tokens; 0 = all")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--tokenizer", default=None, metavar="FILE",
                   help="a tokenizer.json; default: CHECKPOINT/tokenizer.json if present, else bytes")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.set_defaults(func=run)


def load_model(path, device="cpu"):
    """(model, source): a GPT or Llama from a Hugging Face directory or an `hpcfsdp train` checkpoint."""
    from hpcfsdp.models import GPT, GPTConfig, Llama

    cfg_file = os.path.join(path, "config.json")
    if os.path.exists(cfg_file):
        with open(cfg_file) as f:
            kind = json.load(f).get("model_type")
        cls = {"gpt2": GPT, "llama": Llama}.get(kind)
        if cls is None:
            raise ValueError(f"{cfg_file}: model_type {kind!r} is not supported (gpt2 or llama)")
        return cls.from_pretrained(path, device=device), "huggingface"
    from hpcfsdp.distributed import checkpoint as dcp

    try:
        md = dcp.read_metadata(path)
    except Exception as e:  # noqa: BLE001 - reported with the path
        raise ValueError(f"{path}: neither a Hugging Face directory (config.json) nor an hpcfsdp checkpoint ({e})") \
            from None
    saved = ((md.extras or {}).get("skeleton") or {}).get("config")
    if not isinstance(saved, dict):
        raise ValueError(f"{path} holds no training configuration: not written by hpcfsdp train")
    cfg = GPTConfig(vocab_size=saved["vocab_size"], block_size=saved["block_size"], n_layer=saved["n_layer"],
                    n_head=saved["n_head"], n_embd=saved["n_embd"], bias=saved.get("bias", True),
                    tie_weights=saved.get("tie_weights", True), dropout=0.0)
    model = GPT(cfg)
    state = {"model": model.state_dict()}  # detached views of the parameters: filled in place
    dcp.load(state, checkpoint_id=path, strict=False)
    return (model.to(device) if device != "cpu" else model), "hpcfsdp"


def _tokenizer(args):
    path = args.tokenizer or os.path.join(args.checkpoint, "tokenizer.json")
    if args.tokenizer or os.path.exists(path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise SystemExit(f"hpcfsdp generate: {path} needs the `tokenizers` package (pip install tokenizers)")
        tok = Tokenizer.from_file(path)
        return (lambda s: tok.encode(s).ids), (lambda ids: tok.decode(list(ids))), tok.get_vocab_size()
    from hpcfsdp.data.tokenizer import VOCAB_SIZE, decode, encode

    return (lambda s: encode(s).astype("int64")), decode, VOCAB_SIZE


def run(args) -> int:
    import numpy as np

    import hpcfsdp as hp

    try:
        model, _ = load_model(args.checkpoint, "cuda:0" if args.device == "cuda" else "cpu")
    except (ValueError, KeyError, FileNotFoundError, TypeError) as e:
        print(f"hpcfsdp generate: {e}", file=sys.stderr)
        return 1
    encode, decode, vocab = _tokenizer(args)
    if vocab > model.config.vocab_size:
        print(f"hpcfsdp generate: the tokenizer has {vocab} tokens but the model only {model.config.vocab_size}",
              file=sys.stderr)
        return 1
    model.eval()
    ids = np.asarray(encode(args.prompt), dtype=np.int64)
    if ids.size == 0:
        print("hpcfsdp generate: the prompt encodes to no tokens", file=sys.stderr)
        return 2
    hp.manual_seed(args.seed)
    x = hp.tensor(ids[None, :], device=model.lm_head.weight.device)
    for i in range(args.num_samples):
        out = model.generate(x, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k or None)
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        print(decode(hp._backend.to_numpy(out[0]._data).tolist()), flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hpcfsdp")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
