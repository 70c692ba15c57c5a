"""Re-expresses PyTorch's test/distributed/_composable/fsdp/test_fully_shard_training.py (and
test_fully_shard_shared_params.py)."""
import pytest

from _common import (
    MLP,
    Transformer,
    TransformerBlock,
    assert_close,
    check_sharded_parity,
    copy_model,
    global_sum,
    local,
    randint,
    randn,
    ref_loss_backward,
    to_np,
    train_parity,
    world,
)
from _framework import (
    CPUOffloadPolicy,
    DTensor,
    FSDPModule,
    OffloadPolicy,
    Shard,
    fully_shard,
    init_device_mesh,
    nn,
    register_fsdp_forward_method,
    torch,
)

pytestmark = pytest.mark.mpi(min_size=2)


def test_root_no_forward_inputs():
    """A root module whose forward takes no input: output and gradient as computed by hand."""
    class ParameterOnlyModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(randn(4, 4, seed=3))

        def forward(self):
            return self.weight @ self.weight

    model = ParameterOnlyModule()
    W = to_np(model.weight)
    fully_shard(model)
    out = model()
    assert tuple(out.shape) == (4, 4)
    assert_close(out, W @ W, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    ones = W * 0 + 1
    assert_close(model.weight.grad, ones @ W.T + W.T @ ones, rtol=1e-5, atol=1e-5)  # d sum(WW) / dW


def _assert_dtensor(params):
    params = list(params)
    assert params and all(isinstance(p, DTensor) for p in params)


def _assert_plain(params):
    params = list(params)
    assert params and all(not isinstance(p, DTensor) for p in params)


@pytest.mark.parametrize("reshard_after_forward", [True, False, 2, None])
def test_param_registration_after_forward(reshard_after_forward):
    """After forward the module holds sharded DTensors (resharded) or the unsharded plain tensors, by
    reshard_after_forward (None: the root keeps them, the others reshard); reshard() restores DTensors; the
    values stay those of the unsharded model throughout."""
    torch.manual_seed(42)
    model = nn.Sequential(MLP(3), MLP(3))
    ref = copy_model(model)
    fully_shard(model[0].in_proj, reshard_after_forward=reshard_after_forward)
    fully_shard(model[0].out_proj, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    _assert_dtensor(model.parameters())
    model(randn(2, 3, seed=1))
    non_root = list(model[0].in_proj.parameters()) + list(model[0].out_proj.parameters())
    root = [p for p in model.parameters() if all(p is not q for q in non_root)]
    if reshard_after_forward is None:
        _assert_dtensor(non_root)
        _assert_plain(root)
    elif reshard_after_forward:
        _assert_dtensor(non_root)
        _assert_dtensor(root)
    else:
        _assert_plain(non_root)
        _assert_plain(root)
    for p, rp in zip(model.parameters(), ref.parameters()):
        assert_close(p, rp, rtol=0, atol=0)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
    _assert_dtensor(model.parameters())
    for p, rp in zip(model.parameters(), ref.parameters()):
        assert_close(p, rp, rtol=0, atol=0)


@pytest.mark.parametrize("reshard_after_forward", [True, False, 2])
def test_param_registration_after_backward(reshard_after_forward):
    model = MLP(8)
    fully_shard(model.in_proj, reshard_after_forward=reshard_after_forward)
    fully_shard(model.out_proj, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    model(randn(2, 8, seed=0)).sum().backward()
    _assert_dtensor(model.parameters())
    _assert_dtensor(p.grad for p in model.parameters())


def test_to_float64_after_init():
    """model.to(float64) after fully_shard: sharded parameters, their local pieces, the unsharded parameters
    the forward computes with, and the gradients are all float64; training matches a float64 reference."""
    w, _ = world()
    torch.manual_seed(42)
    model = MLP(4)
    ref = copy_model(model).to(torch.float64)
    for m in (model.in_proj, model.out_proj, model):
        fully_shard(m)
    model.to(torch.float64)
    for p in model.parameters():
        assert p.dtype == torch.float64 and p.to_local().dtype == torch.float64
    seen = []
    for lin in (model.in_proj, model.out_proj):
        lin.register_forward_pre_hook(lambda mod, args: seen.append((mod.weight.dtype, args[0].dtype)))
    train_parity(ref, model, lambda it: randn(2 * w, 4, seed=it, dtype=torch.float64), iters=3,
                 rtol=1e-10, atol=1e-12)
    assert seen and all(d == (torch.float64, torch.float64) for d in seen), set(seen)
    for p in model.parameters():
        assert p.grad.dtype == torch.float64 and p.grad.to_local().dtype == torch.float64


@pytest.mark.parametrize("lin_shapes", [[(16, 15), (15, 8)], [(7, 15), (15, 3)], [(16, 17), (17, 8)]])
def test_train_parity_single_group_shard_dim0(lin_shapes):
    w, _ = world()
    torch.manual_seed(42)
    model = nn.Sequential(nn.Linear(*lin_shapes[0]), nn.ReLU(), nn.Linear(*lin_shapes[1]))
    ref = copy_model(model)
    fully_shard(model)
    train_parity(ref, model, lambda it: randn(2 * w, lin_shapes[0][0], seed=it), iters=3)


def test_train_parity_single_group_shard_largest_dim():
    w, _ = world()
    torch.manual_seed(42)
    model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 8))
    ref = copy_model(model)
    fully_shard(model, shard_placement_fn=lambda p: Shard(list(p.shape).index(max(p.shape))))
    assert any(p.placements[0].dim == 1 for p in model.parameters())
    train_parity(ref, model, lambda it: randn(2 * w, 32, seed=it), iters=3)


def _tokens(w, it, vocab=17, T=8):
    return randint(vocab, 2 * w, T, seed=it)


@pytest.mark.parametrize("reshard_after_forward,offload_policy", [(True, "none"), (False, "none"), (2, "none"),
                                                                    (True, "cpu")])
def test_train_parity_multi_group(reshard_after_forward, offload_policy):
    """Per-block groups plus the root, on a small Transformer; CPU offload with reshard_after_forward=True
    (PyTorch's test_train_parity_multi_group_cpu_offload_eager)."""
    w, _ = world()
    torch.manual_seed(42)
    model = Transformer(n_layers=2)
    ref = copy_model(model)
    policy = CPUOffloadPolicy(pin_memory=False) if offload_policy == "cpu" else OffloadPolicy()
    for m in model.modules():
        if isinstance(m, TransformerBlock):
            fully_shard(m, reshard_after_forward=reshard_after_forward, offload_policy=policy)
    fully_shard(model, reshard_after_forward=reshard_after_forward, offload_policy=policy)
    train_parity(ref, model, lambda it: _tokens(w, it), iters=3)


def test_non_root_forward_backward():
    """Forward/backward through the root, then through a non-root child alone (DDP-by-hand reference)."""
    w, _ = world()
    torch.manual_seed(42)
    model = nn.Sequential(*[MLP(8) for _ in range(3)])
    ref = copy_model(model)
    for mlp in model:
        fully_shard(mlp)
    fully_shard(model)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)
    x = randn(2 * w, 8, seed=5)
    loss = model(local(x)).sum()
    loss.backward()
    ref_loss = ref_loss_backward(ref, x)
    assert_close(global_sum(loss), float(ref_loss.item()), rtol=1e-5, atol=1e-5)
    optim.step()
    ref_optim.step()
    optim.zero_grad()
    ref_optim.zero_grad()
    loss = model[0](local(x)).sum()
    loss.backward()
    ref_loss = ref_loss_backward(ref[0], x)
    assert_close(global_sum(loss), float(ref_loss.item()), rtol=1e-5, atol=1e-5)
    check_sharded_parity(ref, model)
    optim.step()
    ref_optim.step()
    assert_close(global_sum(model(local(x)).sum()), float(ref(x).sum().item()), rtol=1e-5, atol=1e-5)


class MultiForwardModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.outer = nn.Linear(4, 5)

    def forward(self, x):
        return self.outer(self.inner(x) + self.inner(x))


@pytest.mark.parametrize("reshard_after_forward", [True, False, 2])
def test_multi_forward_module(reshard_after_forward):
    w, _ = world()
    torch.manual_seed(42)
    model = MultiForwardModule()
    ref = copy_model(model)
    fully_shard(model.inner, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    train_parity(ref, model, lambda it: randn(4 * w, 4, seed=it), iters=3)


def test_explicit_prefetching():
    """set_modules_to_forward_prefetch / set_modules_to_backward_prefetch two layers ahead: parity."""
    w, _ = world()
    torch.manual_seed(42)
    model = Transformer(n_layers=4)
    ref = copy_model(model)
    for layer in list(model.layers) + [model]:
        fully_shard(layer)
    layers = list(model.layers)
    for i, layer in enumerate(layers):
        if i + 2 < len(layers):
            layer.set_modules_to_forward_prefetch([layers[i + 1], layers[i + 2]])
        if i >= 2:
            layer.set_modules_to_backward_prefetch([layers[i - 1], layers[i - 2]])
    train_parity(ref, model, lambda it: _tokens(w, it), iters=3)


@pytest.mark.parametrize("module_grouping", ["block", "mem_eff", "mem_eff_weight_tied"])
@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_train_parity_with_activation_checkpointing(reshard_after_forward, module_grouping):
    """torch.utils.checkpoint around every block, composed with per-block groups or with the memory-efficient
    grouping, whose list units ``fully_shard([layers[1], layers[2]])``, ``[tok, pos]`` embeddings and
    ``[norm, output]`` span several modules (the embeddings not unsharded in backward)."""
    w, _ = world()
    torch.manual_seed(42)
    model = Transformer(n_layers=3, weight_tying=module_grouping != "mem_eff", checkpoint_activations=True)
    ref = copy_model(model)
    kw = {"reshard_after_forward": reshard_after_forward}
    if module_grouping == "mem_eff":
        fully_shard(model.layers[0], **kw)
        fully_shard([model.layers[1], model.layers[2]], **kw)
        fully_shard([model.tok_embeddings, model.pos_embeddings], **kw)
        model.tok_embeddings.set_unshard_in_backward(False)
        fully_shard([model.norm, model.output], **kw)
    elif module_grouping == "mem_eff_weight_tied":
        fully_shard([model.tok_embeddings, model.output], **kw)
        for layer in model.layers:
            fully_shard(layer, **kw)
    else:
        for layer in model.layers:
            fully_shard(layer, **kw)
    fully_shard(model, **kw)
    check_sharded_parity(ref, model)
    train_parity(ref, model, lambda it: _tokens(w, 0), iters=3)


@pytest.mark.parametrize("checkpoint_activations", [False, True])
@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_double_forward_with_nested_fsdp_and_checkpoint(reshard_after_forward, checkpoint_activations):
    """Two forwards before one backward (DPO), nested groups (attention, feed-forward, block, root)."""
    w, _ = world()
    torch.manual_seed(42)
    model = Transformer(n_layers=2, checkpoint_activations=checkpoint_activations)
    ref = copy_model(model)
    for layer in model.layers:
        fully_shard(layer.attention, reshard_after_forward=reshard_after_forward)
        fully_shard(layer.feed_forward, reshard_after_forward=reshard_after_forward)
        fully_shard(layer, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    x1, x2 = _tokens(w, 1), _tokens(w, 2)

    def dpo(m, a, b):
        return (m(a).sum() - m(b).sum()).pow(2)

    dpo(model, local(x1), local(x2)).backward()
    # reference: the per-rank losses are squared, so DDP by hand (average of per-rank gradients)
    for r in range(w):
        n = x1.shape[0] // w
        (dpo(ref, x1[r * n:(r + 1) * n], x2[r * n:(r + 1) * n]) / w).backward()
    check_sharded_parity(ref, model, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("use_activation_checkpointing", [False, True])
@pytest.mark.parametrize("reshard_after_forward", [False, True])
def test_train_parity_with_shared_params(reshard_after_forward, use_activation_checkpointing):
    """Tied embedding/output weights in the root group; blocks in their own groups."""
    w, _ = world()
    torch.manual_seed(42)
    model = Transformer(n_layers=2, weight_tying=True, checkpoint_activations=use_activation_checkpointing)
    ref = copy_model(model)
    for layer in model.layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    assert model.output.weight is model.tok_embeddings.weight
    train_parity(ref, model, lambda it: _tokens(w, it), iters=3)


class TiedModel(nn.Module):
    def __init__(self, vocab, hidden=16):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, hidden)
        self.output = nn.Linear(hidden, vocab, bias=False)
        self.output.weight = self.tok_embeddings.weight

    def forward(self, ids):
        return self.output(self.tok_embeddings(ids))


@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_train_shared_params_uneven_shard(reshard_after_forward):
    """Tied weights in one list unit with a vocabulary not divisible by the world: every row trains (also the
    padded last shard's) and parity holds."""
    w, _ = world()
    vocab = 4 * w + 1
    torch.manual_seed(42)
    model = TiedModel(vocab)
    ref = copy_model(model)
    fully_shard([model.tok_embeddings, model.output], reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    start = to_np(model.tok_embeddings.weight)
    train_parity(ref, model, lambda it: randint(vocab, 2 * w, 8, seed=it), iters=3)
    end = to_np(model.tok_embeddings.weight)
    for row in range(vocab):
        assert (start[row] != end[row]).any(), f"row {row} was not updated"


def test_shared_params_separate_fsdp_groups_error():
    """Tied parameters in two separate fully_shard calls: the first forward raises ValueError."""
    model = TiedModel(17)
    fully_shard(model.tok_embeddings)
    fully_shard(model.output)
    fully_shard(model)
    with pytest.raises(ValueError, match="already managed by another"):
        model(randint(17, 2, 8, seed=0))


def test_train_parity_shard_placement_fn_shard_largest_dim():
    w, _ = world()
    torch.manual_seed(42)
    model = Transformer(vocab_size=16, dim=8, n_layers=2)
    ref = copy_model(model)

    def largest(p):
        return Shard(list(p.shape).index(max(p.shape)))

    for layer in model.layers:
        fully_shard(layer, shard_placement_fn=largest)
    fully_shard(model, shard_placement_fn=largest)
    assert any(p.placements[0].dim == 1 for p in model.parameters())
    check_sharded_parity(ref, model)
    train_parity(ref, model, lambda it: randint(16, 2 * w, 8, seed=it), iters=3)


def test_shard_placement_fn_contiguous_params_grads():
    """Shard(1) for matrices: sharded parameters, unsharded ones in forward, and gradients are contiguous."""
    model = MLP(4)

    def fn(p):
        return Shard(1) if p.ndim > 1 else Shard(0)

    for m in (model.in_proj, model.out_proj, model):
        fully_shard(m, shard_placement_fn=fn)
    seen = []
    for m in (model.in_proj, model.out_proj):
        m.register_forward_pre_hook(lambda mod, args: seen.extend(p.is_contiguous() for p in mod.parameters()))
    for p in model.parameters():
        assert p.is_contiguous() and p.to_local().is_contiguous()
    model(randn(2, 4, seed=0)).sum().backward()
    assert seen and all(seen)
    for p in model.parameters():
        assert p.grad.is_contiguous() and p.grad.to_local().is_contiguous()


@pytest.mark.parametrize("use_activation_checkpointing", [False, True])
@pytest.mark.parametrize("reshard_after_forward", [False, True])
def test_train_parity_hsdp(reshard_after_forward, use_activation_checkpointing):
    """HSDP on a (world/2, 2) mesh with micro-batches synced only at the last one."""
    w, _ = world()
    mesh = init_device_mesh("cpu", (w // 2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    torch.manual_seed(42)
    from _common import CheckpointedSequential

    seq = CheckpointedSequential if use_activation_checkpointing else nn.Sequential
    model = seq(nn.LayerNorm(5, bias=False), MLP(5, dim_multiplier=3), MLP(5), MLP(5, dim_multiplier=3))
    ref = copy_model(model)
    for m in model:
        fully_shard(m, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for it in range(2):
        for mb in range(3):
            model.set_requires_gradient_sync(mb == 2)
            x = randn(2 * w, 5, seed=10 * it + mb)
            loss = model(local(x)).sum()
            loss.backward()
            ref_loss = ref_loss_backward(ref, x)
            assert_close(global_sum(loss), float(ref_loss.item()), rtol=1e-5, atol=1e-5)
        check_sharded_parity(ref, model)
        optim.step()
        ref_optim.step()
        optim.zero_grad(set_to_none=(it % 2 == 0))
        ref_optim.zero_grad(set_to_none=(it % 2 == 0))
    check_sharded_parity(ref, model, check_grads=False)
    for p in model.parameters():
        assert p.device_mesh.ndim == 2


def test_register_fsdp_forward_method():
    """A child run through a method other than forward (register_fsdp_forward_method)."""
    class VisionTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch_proj = nn.Conv2d(3, 8, kernel_size=4, stride=4)

        def forward_features(self, imgs):
            return self.patch_proj(imgs).flatten(2).transpose(1, 2)  # (B, patches, 8)

        def forward(self, imgs):
            return self.forward_features(imgs).sum(dim=1)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.vit, self.projector = VisionTransformer(), nn.Linear(8, 4)

        def forward(self, imgs):
            return self.projector(self.vit.forward_features(imgs))

    w, _ = world()
    torch.manual_seed(42)
    model = Model()
    ref = copy_model(model)
    fully_shard(model.vit)
    fully_shard(model.projector)
    fully_shard(model)
    register_fsdp_forward_method(model.vit, "forward_features")
    x = randn(2 * w, 3, 8, 8, seed=2)
    loss = model(local(x)).sum()
    loss.backward()
    ref_loss = ref_loss_backward(ref, x)
    assert_close(global_sum(loss), float(ref_loss.item()), rtol=1e-5, atol=1e-5)
    check_sharded_parity(ref, model)


@pytest.mark.parametrize("use_explicit_unshard", [False, True])
@pytest.mark.parametrize("reshard_after_backward", [False, True])
def test_1f1b_microbatching(use_explicit_unshard, reshard_after_backward):
    """1F1B-like micro-batches with reshard_after_forward=False, optional async explicit unshard, sync and
    reshard-after-backward only on the last micro-batch."""
    w, _ = world()
    torch.manual_seed(42)
    model = Transformer(n_layers=2)
    ref = copy_model(model)
    for layer in model.layers:
        fully_shard(layer, reshard_after_forward=False)
    fully_shard(model, reshard_after_forward=False)
    if use_explicit_unshard:
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.unshard(async_op=True)
    n = 3
    for i in range(n):
        last = i == n - 1
        model.set_requires_gradient_sync(last)
        model.set_is_last_backward(last)
        if not reshard_after_backward:
            model.set_reshard_after_backward(last)
        x = _tokens(w, i)
        loss = model(local(x)).sum()
        loss.backward()
        ref_loss = ref_loss_backward(ref, x)
        assert_close(global_sum(loss), float(ref_loss.item()), rtol=1e-5, atol=1e-5)
    check_sharded_parity(ref, model)
