"""Many ranks' reports in few lines: what is the same everywhere once, what differs grouped by rank ranges.

`hpcfsdp info --all-ranks` gathers one report (a dict) per rank. `grouped_lines` prints the items
equal on every rank once, in the report's layout, then each item that differs as groups of ranks
sharing a value ("ranks 0-3: a"); items that split the ranks the same way (host name and node
index, say) share one block, so a job of N nodes prints about one line per node, not per rank.
An item that differs on every rank of a large job (a process id) is summarised by its ends.
"""

__all__ = ["rank_ranges", "node_layout", "grouped_lines"]

_ABSENT = "<absent>"
_SUMMARY_ABOVE = 16  # an item distinct on every rank is listed in full up to this many ranks


def rank_ranges(ranks) -> str:
    """Sorted rank numbers compressed: [0, 1, 2, 3, 8] -> '0-3,8'; a stride-k progression -> '0,4,...,60'."""
    rs = sorted(set(ranks))
    if len(rs) > 3 and rs[1] - rs[0] > 1 and all(b - a == rs[1] - rs[0] for a, b in zip(rs, rs[1:])):
        return f"{rs[0]},{rs[1]},...,{rs[-1]}"
    runs, start = [], 0
    for i in range(1, len(rs) + 1):
        if i == len(rs) or rs[i] != rs[i - 1] + 1:
            a, b = rs[start], rs[i - 1]
            runs.append(str(a) if a == b else f"{a}-{b}")
            start = i
    return ",".join(runs)


def _ranks(ranks) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)


def _flat(info: dict, value_text) -> dict:
    """{(section, key): text} of one report; section None for top-level items."""
    out = {}
    for key, value in info.items():
        if isinstance(value, dict):
            for k, v in value.items():
                out[(key, k)] = value_text(key, v)
        else:
            out[(None, key)] = value_text(None, value)
    return out


def node_layout(node_of_rank) -> str:
    """`node_of_rank` (node index per rank) in one short phrase."""
    n = len(node_of_rank)
    nodes = len(set(node_of_rank))
    k = n // nodes if nodes else 0
    if nodes and n % nodes == 0 and list(node_of_rank) == [r // k for r in range(n)]:
        return f"{nodes} node(s) of {k} rank(s), in blocks (node i: ranks {k}i..{k}i+{k - 1})"
    if nodes and list(node_of_rank) == [r % nodes for r in range(n)]:
        return f"{nodes} node(s), ranks round-robin (node i: ranks i, i+{nodes}, ...)"
    groups = {}
    for r, node in enumerate(node_of_rank):
        groups.setdefault(node, []).append(r)
    return "; ".join(f"node {node}: {_ranks(rs)}" for node, rs in groups.items())


def grouped_lines(reports: list, value_text=None) -> list:
    """Lines for one report per rank (``reports[r]`` from rank r); ``value_text(section, value)`` renders a value."""
    value_text = value_text or (lambda section, value: str(value))
    world = len(reports)
    flats = [_flat(r, value_text) for r in reports]
    keys = list(dict.fromkeys(k for f in flats for k in f))
    same, differ = {}, []
    for key in keys:
        values = [f.get(key, _ABSENT) for f in flats]
        if key == (None, "world_rank") and values == [str(r) for r in range(world)]:
            same[key] = "each rank's own number"
        elif key == (None, "node_of_rank") and len(set(values)) == 1 and isinstance(reports[0].get("node_of_rank"),
                                                                                     list):
            same[key] = node_layout(reports[0]["node_of_rank"])
        elif len(set(values)) == 1:
            same[key] = values[0]
        else:
            differ.append((key, values))
    lines = [f"{world} rank(s); the same on every rank:"]
    section = None
    for (sec, k), text in same.items():
        if sec is None:
            lines.append(f"{k}: {text}")
            continue
        if sec != section:
            lines.append(f"{sec}:")
            section = sec
        lines.append(f"  {k}: {text}")
    if not differ:
        lines.append("nothing differs between ranks")
        return lines
    # one block per way of splitting the ranks; a block names every item that splits them so
    blocks = {}
    for key, values in differ:
        groups = {}
        for r, v in enumerate(values):
            groups.setdefault(v, []).append(r)
        split = tuple(tuple(rs) for rs in sorted(groups.values()))
        blocks.setdefault(split, []).append((key, values))
    lines.append("differs between ranks:")
    for split, items in blocks.items():
        names = ", ".join(k if sec is None else f"{sec}.{k}" for (sec, k), _ in items)
        lines.append(f"  {names}:")
        rows = [f"    {_ranks(rs)}: {', '.join(values[rs[0]] for _, values in items)}" for rs in split]
        if len(split) == world and world > _SUMMARY_ABOVE:
            rows = rows[:3] + [f"    ... (a different value on each of the {world} ranks; --json lists them)",
                               rows[-1]]
        lines.extend(rows)
    return lines
