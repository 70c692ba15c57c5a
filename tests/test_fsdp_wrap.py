"""Auto-wrap policies without communication: ``_or_policy`` (PyTorch's private combinator, which FSDP1 scripts
import from torch.distributed.fsdp.wrap) and what select_units makes of a combination."""
import functools

from hpcfsdp import nn
from hpcfsdp.distributed.fsdp.wrap import ModuleWrapPolicy, _or_policy, select_units, size_based_auto_wrap_policy


def _policy(answer, calls):
    def policy(module, recurse, nonwrapped_numel):
        calls.append((answer, module, recurse, nonwrapped_numel))
        return answer

    return policy


def test_or_policy_is_true_when_any_policy_is():
    m, calls = nn.Linear(2, 3), []
    assert _or_policy(m, False, 9, [_policy(False, calls), _policy(True, calls)]) is True
    assert _or_policy(m, True, 9, [_policy(False, calls), _policy(False, calls)]) is False
    assert _or_policy(m, False, 9, []) is False  # no policy: nothing wraps
    # every policy is asked the same question (as keywords), in order, until one says True
    assert [(a, mod, r, n) for a, mod, r, n in calls] == [(False, m, False, 9), (True, m, False, 9),
                                                          (False, m, True, 9), (False, m, True, 9)]
    calls.clear()
    assert _or_policy(module=m, recurse=False, nonwrapped_numel=9, policies=[_policy(True, calls),
                                                                            _policy(False, calls)]) is True
    assert len(calls) == 1  # any(): the first True ends it


def test_or_of_two_policies_picks_the_units_of_either():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 300)), nn.LayerNorm(4))
    name = {id(m): n for n, m in model.named_modules()}
    by_class = ModuleWrapPolicy({nn.LayerNorm})
    by_size = functools.partial(size_based_auto_wrap_policy, min_num_params=1000)  # the 4x300 Linear only
    either = functools.partial(_or_policy, policies=[by_class, by_size])  # as FSDP1 scripts bind it
    assert [name[id(u)] for u in select_units(model, by_class)] == ["1.0", "2"]
    assert [name[id(u)] for u in select_units(model, by_size)] == ["1.1"]
    assert [name[id(u)] for u in select_units(model, either)] == ["1.0", "1.1", "2"]
