"""What `hpcfsdp checkpoint inspect` prints first: step, world size, model configuration, date and size of a checkpoint.

A training checkpoint (`hpcfsdp train`) keeps its configuration and step in the metadata's extras
(``extras["skeleton"]["config"]``, ``["step"]``); other checkpoints may keep a ``step`` at the top of
their extras or none. The date is the modification time of metadata.json, which a save writes last,
when it commits; the size on disk counts every file in the checkpoint's directory.
"""

import argparse
import dataclasses
import datetime
import json
import math
import os

__all__ = ["summary", "summary_lines", "model_fields"]


def model_fields() -> list:
    """The TrainConfig fields of `hpcfsdp train`'s "model" flags, in their order."""
    from .config import add_config_arguments

    p = argparse.ArgumentParser(add_help=False)
    add_config_arguments(p)
    for group in p._action_groups:
        if group.title == "model":
            return [a.dest for a in group._group_actions]
    return []


def _saved_config(md):
    skeleton = (md.extras or {}).get("skeleton") if isinstance(md.extras, dict) else None
    return skeleton if isinstance(skeleton, dict) else None


def _step(md):
    skeleton = _saved_config(md)
    for where in (skeleton, md.extras if isinstance(md.extras, dict) else None):
        if where is not None and isinstance(where.get("step"), int) and not isinstance(where.get("step"), bool):
            return where["step"]
    return None


def _disk(path):
    total = count = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
                count += 1
            except OSError:
                pass
    return total, count


def summary(md, given_path: str) -> dict:
    """The header of `checkpoint inspect` as a JSON-ready dict (`--json` prints it as "summary")."""
    skeleton = _saved_config(md)
    config = skeleton.get("config") if skeleton and isinstance(skeleton.get("config"), dict) else None
    model = None
    built = skeleton.get("model_config") if skeleton else None
    if isinstance(built, dict):  # the built model's own config (every field resolved), as the checkpoint keeps it
        from hpcfsdp.models import GPTConfig, LlamaConfig

        cls = LlamaConfig if built.get("model") == "llama" else GPTConfig
        order = ["model", *(f.name for f in dataclasses.fields(cls))]  # the metadata's keys come back sorted
        model = {k: built[k] for k in order if k in built}
        model.update({k: v for k, v in built.items() if k not in model})
    elif config is not None:  # older checkpoints: the training config's model flags that were set
        keys = [k for k in ("model", *model_fields()) if k in config and config[k] is not None]
        model = {k: config[k] for k in keys}
    params = [e for n, e in md.entries.items() if n.startswith("model.")]
    mtime = os.stat(os.path.join(md.path, "metadata.json")).st_mtime
    size, nfiles = _disk(md.path)
    groups = {}
    for name in md.entries:
        head = name.split(".", 1)[0]
        groups[head] = groups.get(head, 0) + 1
    return {
        "path": given_path, "target": md.path, "step": _step(md), "world_size": md.world_size, "mesh": md.mesh,
        "model": model, "parameters": sum(math.prod(e.shape) for e in params) if params else None,
        "saved": datetime.datetime.fromtimestamp(mtime).astimezone().isoformat(timespec="seconds"),
        "size_on_disk_bytes": size, "files_on_disk": nfiles, "entries": len(md.entries), "entry_groups": groups,
        "tensor_bytes": md.total_bytes, "format_version": md.version, "shard_files": len(md.files),
        "checksum_block_bytes": md.block_size,
        "extras": sorted(skeleton) if skeleton is not None else (
            sorted(md.extras) if isinstance(md.extras, dict) else None),
    }


def _count(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def summary_lines(md, s: dict, fmt_bytes) -> list:
    """The header as text lines, one per item."""
    linked = os.path.realpath(s["path"]) != os.path.abspath(s["path"])
    lines = [f"checkpoint: {s['path']}" + (f" -> {s['target']}" if linked else "")]
    lines.append(f"step: {s['step'] if s['step'] is not None else 'not recorded'}")
    lines.append(f"world size: {s['world_size']} rank(s), mesh {json.dumps(s['mesh'])}")
    if s["model"] is not None:
        settings = " ".join(f"{k}={v}" for k, v in s["model"].items())
        values = f" ({_count(s['parameters'])} values in model.* entries)" if s["parameters"] is not None else ""
        lines.append(f"model: {settings}{values}")
    elif s["parameters"] is not None:
        lines.append(f"model: {_count(s['parameters'])} values in model.* entries (no training configuration saved)")
    else:
        lines.append("model: no training configuration saved")
    when = datetime.datetime.fromisoformat(s["saved"])
    lines.append(f"saved: {when.strftime('%Y-%m-%d %H:%M:%S %Z').strip()}")
    lines.append(f"size on disk: {s['size_on_disk_bytes']} bytes ({fmt_bytes(s['size_on_disk_bytes'])}) in "
                 f"{s['files_on_disk']} file(s) "
                 f"({s['shard_files']} shard file(s) and metadata.json)")
    groups = ", ".join(f"{k} {v}" for k, v in s["entry_groups"].items())
    lines.append(f"entries: {s['entries']}" + (f" ({groups})" if len(s["entry_groups"]) > 1 else "")
                 + f", {s['tensor_bytes']} bytes ({fmt_bytes(s['tensor_bytes'])}) of tensors; --entries lists them")
    lines.append(f"format: version {s['format_version']}, checksum block {fmt_bytes(s['checksum_block_bytes'])}")
    if _saved_config(md) is None and isinstance(md.extras, dict) and len(json.dumps(md.extras)) <= 200:
        lines.append(f"extras: {json.dumps(md.extras, sort_keys=True)}")
    elif s["extras"] is not None:
        lines.append(f"extras: {', '.join(s['extras'])} (--json prints them)")
    return lines
