"""hpcfsdp.random (seeds, RNG states, fork_rng, Generator as ``generator=``) and hpcfsdp.testing.assert_close."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.testing import assert_close


def _draws(device="cpu", generator=None):
    """One draw from every creation function that takes ``generator=``, as NumPy arrays."""
    x = hp.zeros(3, device=device)
    out = [hp.rand(4, device=device, generator=generator), hp.randn(2, 3, device=device, generator=generator),
           hp.randint(0, 1000, (5,), device=device, generator=generator),
           hp.randperm(7, device=device, generator=generator), hp.rand_like(x, generator=generator),
           hp.randn_like(x, generator=generator)]
    w = hp.empty(3, 2, device=device)
    for init in (lambda: nn.init.uniform_(w, -1, 1, generator=generator),
                 lambda: nn.init.normal_(w, generator=generator),
                 lambda: nn.init.trunc_normal_(w, generator=generator),
                 lambda: nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)):
        out.append(init().clone())
    return [t.cpu().numpy() for t in out]


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


# ---- the global generator ----------------------------------------------------------------------------------------

def test_rng_state_round_trip_repeats_the_next_draws():
    hp.manual_seed(11)
    hp.rand(5)
    state = hp.get_rng_state()
    assert isinstance(state, hp.Tensor) and state.dtype == hp.uint8 and state.ndim == 1
    first = _draws()
    x = hp.ones(50)
    drop_first = nn.functional.dropout(x, 0.5, training=True).numpy()
    hp.set_rng_state(state)
    assert _same(_draws(), first)
    assert np.array_equal(nn.functional.dropout(x, 0.5, training=True).numpy(), drop_first)
    assert not _same(_draws(), first)  # the stream moved on
    state[:] = 0  # the returned tensor is a copy: changing it changes nothing
    hp.set_rng_state(hp.random.get_rng_state())


def test_rng_state_survives_a_reseed_and_carries_the_initial_seed():
    hp.manual_seed(5)
    state = hp.get_rng_state()
    expected = hp.randn(6).numpy()
    hp.manual_seed(7)
    assert hp.initial_seed() == 7
    hp.set_rng_state(state)
    assert hp.initial_seed() == 5 and np.array_equal(hp.randn(6).numpy(), expected)


def test_manual_seed_initial_seed_and_seed():
    assert hp.random.manual_seed is not None and hp.random.initial_seed is hp.initial_seed
    hp.random.manual_seed(123)
    assert hp.initial_seed() == 123 == hp.random.default_generator.initial_seed()
    a = hp.randn(3).numpy()
    hp.manual_seed(123)
    assert np.array_equal(hp.randn(3).numpy(), a)
    hp.manual_seed(-1)  # PyTorch's range: negative seeds wrap to uint64
    assert hp.initial_seed() == 2 ** 64 - 1
    for bad in (2 ** 64, -2 ** 63 - 1):
        with pytest.raises(ValueError, match="Seed must be within the range"):
            hp.manual_seed(bad)
    s = hp.seed()
    assert isinstance(s, int) and 0 <= s < 2 ** 64 and hp.initial_seed() == s
    assert hp.random.seed() != s  # from the OS's entropy
    hp.manual_seed(0)


def test_set_rng_state_rejects_bad_states():
    with pytest.raises(TypeError, match=r"RNG state must be a uint8 Tensor \(hp.ByteTensor\), got a float32 Tensor"):
        hp.set_rng_state(hp.zeros(3))
    with pytest.raises(TypeError, match="got list"):
        hp.set_rng_state([1, 2])
    with pytest.raises(RuntimeError, match="Expected a CPU hpcfsdp RNG state of size 50 but found the input RNG state "
                                           "size to be 3"):
        hp.set_rng_state(hp.zeros(3, dtype=hp.uint8))
    bad = hp.get_rng_state()
    bad[0] = 0
    with pytest.raises(RuntimeError, match="not to be an hpcfsdp state"):
        hp.set_rng_state(bad)


def test_fork_rng_restores_the_cpu_state():
    hp.manual_seed(3)
    expected = hp.rand(4).numpy()
    hp.manual_seed(3)
    with hp.random.fork_rng():
        inside = hp.rand(4).numpy()
        hp.rand(100)
    assert np.array_equal(inside, expected) and np.array_equal(hp.rand(4).numpy(), expected)
    hp.manual_seed(3)
    with pytest.raises(KeyError):
        with hp.random.fork_rng(devices=[]):
            hp.rand(4)
            raise KeyError("inside")
    assert np.array_equal(hp.rand(4).numpy(), expected)  # restored on an exception too
    hp.manual_seed(3)
    with hp.random.fork_rng(enabled=False):
        hp.rand(4)
    assert not np.array_equal(hp.rand(4).numpy(), expected)
    with pytest.raises(RuntimeError, match="device_type must be 'cuda'"):
        with hp.random.fork_rng(device_type="xpu"):
            pass


def test_names_reachable_as_pytorch_spells_them():
    import hpcfsdp.random as hr
    assert hp.random is hr and hp.Generator is hr.Generator
    for name in hr.__all__:
        assert getattr(hr, name) is not None
    assert hp.get_rng_state is hr.get_rng_state and hp.set_rng_state is hr.set_rng_state and hp.seed is hr.seed
    assert hp.testing.assert_close is assert_close
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        hp.testing.nope  # noqa: B018


# ---- Generator -----------------------------------------------------------------------------------------------------

def test_generator_is_independent_of_the_global_seed(device):
    g = hp.Generator(device)
    assert g.device == hp.device(device) or (device == "cuda" and g.device.type == "cuda")
    assert g.initial_seed() == 67280421310721  # PyTorch's seed of a new Generator
    assert g.manual_seed(42) is g and g.initial_seed() == 42
    hp.manual_seed(0)
    first = _draws(device, g)
    hp.manual_seed(999)
    hp.randn(17, device=device)  # global draws do not move g
    g.manual_seed(42)
    assert _same(_draws(device, g), first)
    assert _same(_draws(device, hp.Generator(device).manual_seed(42)), first)
    hp.manual_seed(5)
    glob = _draws(device)
    hp.manual_seed(5)
    _draws(device, g)  # draws from g do not move the global generator
    assert _same(_draws(device), glob)


def test_generator_state_round_trip(device):
    g = hp.Generator(device).manual_seed(8)
    hp.rand(3, device=device, generator=g)
    state = g.get_state()
    assert state.dtype == hp.uint8 and state.device.type == "cpu"
    after = _draws(device, g)
    assert g.set_state(state) is g
    assert _same(_draws(device, g), after) and g.initial_seed() == 8
    other = hp.Generator(device)
    other.set_state(state)  # a state moves between generators of one device type
    assert _same(_draws(device, other), after) and other.initial_seed() == 8


def test_generator_seed_and_errors(device):
    g = hp.Generator(device)
    s = g.seed()
    assert isinstance(s, int) and g.initial_seed() == s
    if device == "cuda":
        with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'cuda'"):
            hp.rand(2, generator=g)
        with pytest.raises(RuntimeError, match="Expected a 'cuda' device type for generator but found 'cpu'"):
            hp.rand(2, device="cuda", generator=hp.Generator())
    with pytest.raises(ValueError, match="Seed must be within the range"):
        g.manual_seed(2 ** 64)
    with pytest.raises(RuntimeError, match="state"):
        g.set_state(hp.zeros(2, dtype=hp.uint8))


def test_generator_argument_checks():
    with pytest.raises(RuntimeError, match="device type 'meta' has no random generator"):
        hp.Generator("meta")
    with pytest.raises(TypeError, match="generator must be an hp.Generator, got int"):
        hp.randn(2, generator=3)
    assert hp.randn(2, device="meta", generator=hp.Generator()).is_meta
    w = hp.empty(4)  # NumPy generators stay accepted where they were (nn.init)
    nn.init.uniform_(w, generator=np.random.default_rng(1))
    assert np.array_equal(w.numpy(), np.random.default_rng(1).random(4, dtype=np.float32))
    assert "Generator" in repr(hp.Generator())


def test_default_generator_is_the_global_one():
    dg = hp.random.default_generator
    assert dg.manual_seed(9) is dg and hp.initial_seed() == 9
    a = hp.rand(3).numpy()
    hp.manual_seed(9)
    assert np.array_equal(hp.rand(3, generator=dg).numpy(), a)
    hp.manual_seed(9)
    assert np.array_equal(dg.get_state().numpy(), hp.get_rng_state().numpy())
    hp.rand(3)
    dg.set_state(hp.random.default_generator.get_state())
    hp.manual_seed(0)


@pytest.mark.gpu
def test_fork_rng_forks_cuda_devices():
    hp.manual_seed(1)
    with hp.random.fork_rng():
        inside_gpu = hp.randn(5, device="cuda").cpu().numpy()
        inside_cpu = hp.randn(5).numpy()
    # the CPU generator is back where it was; each device's is the one forked at entry
    assert np.array_equal(hp.randn(5).numpy(), inside_cpu)
    assert np.array_equal(hp.randn(5, device="cuda").cpu().numpy(), inside_gpu)
    with hp.random.fork_rng(devices=[0]):
        inside_gpu = hp.randn(5, device="cuda").cpu().numpy()
    assert np.array_equal(hp.randn(5, device="cuda").cpu().numpy(), inside_gpu)


# ---- assert_close --------------------------------------------------------------------------------------------------

def _message(actual, expected, **kw):
    with pytest.raises(AssertionError) as info:
        assert_close(actual, expected, **kw)
    return str(info.value)


def test_assert_close_passes():
    assert_close(hp.tensor([1.0, 2.0]), hp.tensor([1.0, 2.0 + 1e-6]))
    assert_close(np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    assert_close(1.0, 1.0 + 1e-8)
    assert_close([hp.tensor(1.0), {"a": (2, 3.0)}], (hp.tensor(1.0), {"a": [2, 3.0]}))
    assert_close(None, None)
    assert_close(True, np.bool_(True))
    assert_close(hp.tensor([float("nan"), 1.0]), hp.tensor([float("nan"), 1.0]), equal_nan=True)
    assert_close(hp.tensor([math.inf, -math.inf]), hp.tensor([math.inf, -math.inf]))
    assert_close(hp.tensor([1.0]), hp.tensor([1.1]), rtol=0.2, atol=0.0)
    assert_close(hp.zeros(0), hp.zeros(0))
    assert_close(nn.Parameter(hp.ones(2)), hp.ones(2))  # subclasses are allowed
    assert_close(hp.tensor([1.0, 2.0], dtype=hp.float64), hp.tensor([1.0, 2.000001]), check_dtype=False)
    assert_close(hp.empty(2, 3, device="meta"), hp.empty(2, 3, device="meta"))  # attributes only


def test_assert_close_tensor_message():
    msg = _message(hp.tensor([1.0, 2.0, 3.0]), hp.tensor([1.0, 2.5, 3.1]))
    assert msg == ("Tensor-likes are not close!\n\n"
                   "Mismatched elements: 2 / 3 (66.7%)\n"
                   "Greatest absolute difference: 0.5 at index (1,) (up to 1e-05 allowed)\n"
                   "Greatest relative difference: 0.20000000298023224 at index (1,) (up to 1.3e-06 allowed)")
    msg = _message(hp.tensor([[1, 2], [3, 4]]), hp.tensor([[1, 2], [3, 5]]))
    assert msg == ("Tensor-likes are not equal!\n\n"
                   "Mismatched elements: 1 / 4 (25.0%)\n"
                   "Greatest absolute difference: 1 at index (1, 1)\n"
                   "Greatest relative difference: 0.20000000298023224 at index (1, 1)")
    assert _message(hp.tensor(1.0), hp.tensor(1.5)) == (
        "Scalars are not close!\n\nExpected 1.5 but got 1.0.\n"
        "Absolute difference: 0.5 (up to 1e-05 allowed)\nRelative difference: 0.3333333333333333 (up to 1.3e-06 "
        "allowed)")
    assert "Greatest absolute difference: nan at index (0,)" in _message(hp.tensor([math.nan]), hp.tensor([math.nan]))
    assert "Greatest absolute difference: inf" in _message(hp.tensor([math.inf]), hp.tensor([-math.inf]))
    msg = _message(np.array([1.0, 2.0]), np.array([1.0, 2.5]))  # NumPy float64: float64's tolerances
    assert "Greatest relative difference: 0.2 at index (1,) (up to 1e-07 allowed)" in msg


def test_assert_close_scalars_and_containers():
    assert _message(1, 2) == ("Scalars are not equal!\n\nExpected 2 but got 1.\nAbsolute difference: 1\n"
                              "Relative difference: 0.5")
    assert _message(1.0, 1) == "The (d)types do not match: <class 'float'> != <class 'int'>."
    assert_close(1.0, 1, check_dtype=False)
    assert _message(True, False) == "Booleans mismatch: True is not False"
    assert _message(hp.tensor([1.0]), None) == "None mismatch: tensor([1.]) is not None"
    assert _message([1.0, 2.0], [1.0, 2.5]).endswith("The failure occurred for item [1]")
    assert _message({"a": [0, hp.tensor(1.0)]}, {"a": [0, hp.tensor(2.0)]}).endswith(
        "The failure occurred for item ['a'][1]")
    assert _message({"a": 1.0}, {"b": 1.0}) == ("The keys of the mappings do not match:\n"
                                                "Missing keys in the actual mapping: ['b']\n"
                                                "Additional keys in the actual mapping: ['a']")
    assert _message([1.0], [1.0, 2.0]) == "The length of the sequences mismatch: 1 != 2"


def test_assert_close_attributes():
    assert _message(hp.tensor([1.0, 2.0]), hp.tensor([1.0])) == (
        "The values for attribute 'shape' do not match: hp.Size([2]) != hp.Size([1]).")
    assert _message(hp.tensor([1.0]), hp.tensor([1.0], dtype=hp.float64)) == (
        "The values for attribute 'dtype' do not match: hp.float32 != hp.float64.")
    assert _message(hp.zeros(2, 3), hp.zeros(3, 2).t(), check_stride=True) == (
        "The values for attribute 'stride()' do not match: (3, 1) != (1, 2).")
    assert_close(hp.zeros(2, 3), hp.zeros(3, 2).t())  # strides are not checked by default


@pytest.mark.gpu
def test_assert_close_device():
    assert _message(hp.zeros(2, device="cuda"), hp.zeros(2)) == (
        "The values for attribute 'device' do not match: cuda:0 != cpu.")
    assert_close(hp.zeros(2, device="cuda"), hp.zeros(2), check_device=False)
    assert "Mismatched elements: 1 / 2" in _message(hp.tensor([0.0, 1.0], device="cuda"),
                                                    hp.tensor([0.0, 2.0], device="cuda"))


@pytest.mark.parametrize("dtype,rtol,atol", [(hp.float32, 1.3e-6, 1e-5), (hp.float64, 1e-7, 1e-7),
                                             (hp.float16, 1e-3, 1e-5), (hp.bfloat16, 1.6e-2, 1e-5)])
def test_assert_close_default_tolerances_by_dtype(dtype, rtol, atol):
    expected = hp.tensor([100.0], dtype=dtype)
    inside = hp.tensor([100.0 * (1 + 0.5 * rtol)], dtype=dtype)
    outside = hp.tensor([100.0 * (1 + 3 * rtol)], dtype=dtype)
    if dtype == hp.bfloat16:  # 100 has an ulp of 0.5 in bfloat16: step by ulps
        inside, outside = hp.tensor([100.5], dtype=dtype), hp.tensor([102.0], dtype=dtype)
    assert_close(inside, expected)
    msg = _message(outside, expected)
    assert f"(up to {atol} allowed)" in msg and f"(up to {rtol} allowed)" in msg
    assert_close(hp.tensor([0.0], dtype=dtype), hp.tensor([0.9 * atol], dtype=dtype))  # atol near zero


def test_assert_close_integers_are_exact_and_mixed_dtypes_take_the_looser():
    for dt in (hp.int64, hp.int32, hp.int8, hp.uint8, hp.bool):
        assert "are not equal!" in _message(hp.tensor([1, 0], dtype=dt), hp.tensor([1, 1], dtype=dt))
    assert "Greatest absolute difference: 1 at index (1,)" in _message(hp.tensor([2, 1], dtype=hp.uint8),
                                                                        hp.tensor([2, 2], dtype=hp.uint8))
    a, b = hp.tensor([1.0], dtype=hp.float64), hp.tensor([1.0 + 5e-6])  # float32's tolerance applies
    assert_close(a, b, check_dtype=False)
    with pytest.raises(AssertionError, match=r"up to 1e-07 allowed"):
        assert_close(a, b.double())


def test_assert_close_custom_messages_and_argument_errors():
    assert _message(hp.tensor([1.0]), hp.tensor([2.0]), msg="custom") == "custom"
    assert _message(hp.tensor([1.0]), hp.tensor([2.0]), msg=lambda m: "Header\n\n" + m).startswith(
        "Header\n\nTensor-likes are not close!")
    with pytest.raises(ValueError, match="Both 'rtol' and 'atol' must be either specified or omitted, but got no "
                                         "atol."):
        assert_close(hp.tensor([1.0]), hp.tensor([1.0]), rtol=0.1)
    with pytest.raises(TypeError, match="No comparison pair was able to handle inputs of type <class "
                                        "'numpy.ndarray'> and <class 'hpcfsdp._tensor.Tensor'>."):
        assert_close(np.array([1.0]), hp.tensor([1.0]))
    with pytest.raises(TypeError, match="No comparison pair"):
        assert_close(1.0, hp.tensor(1.0))
    with pytest.raises(TypeError, match="No comparison pair"):
        assert_close("a", "a")
    with pytest.raises(TypeError, match="No comparison pair"):
        assert_close(nn.Parameter(hp.ones(2)), hp.ones(2), allow_subclasses=False)
    with pytest.raises(RuntimeError, match="rtol must be greater than or equal to zero, but got -1"):
        assert_close(hp.tensor([1.0]), hp.tensor([1.0]), rtol=-1.0, atol=0.0)
