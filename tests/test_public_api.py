"""The public names and signatures match the committed snapshot (tests/data/public_api.txt)."""
import api_snapshot


def test_tree_matches_the_committed_snapshot():
    d = api_snapshot.diff(api_snapshot.snapshot(), api_snapshot.read_committed())
    assert not d, ("public API differs from tests/data/public_api.txt (regenerate with "
                   "`python tests/api_snapshot.py --write` only for a deliberate change):\n" + "\n".join(d[:60]))


def test_snapshot_covers_the_core_namespaces():
    committed = api_snapshot.read_committed()
    for name in ("hpcfsdp.Tensor.sum: method", "hpcfsdp.nn.Linear: class", "hpcfsdp.optim.AdamW: class",
                 "hpcfsdp.distributed.fsdp.fully_shard: function", "hpcfsdp.exp: function",
                 "hpcfsdp.nn.functional.gelu: function", "hpcfsdp.distributed.tensor.DTensor: class"):
        assert any(line.startswith(name) for line in committed), name


def test_diff_sees_a_changed_signature():
    old = ["hpcfsdp.f: function(x, y=1)"]
    assert api_snapshot.diff(["hpcfsdp.f: function(x, y=2)"], old) == [
        "- hpcfsdp.f: function(x, y=1)", "+ hpcfsdp.f: function(x, y=2)"]
    assert api_snapshot.diff(old, old) == []
