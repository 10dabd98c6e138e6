"""The PyTorch port against the NumPy MiniGPT: weight loading, layer-by-layer equivalence,
the nn.MultiheadAttention variant, torch.compile / torch.export, and input validation.

Run with `-s` to see the table of worst differences per layer."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model import numpy_minigpt
from model.numpy_minigpt import NumpyMiniGPT, expected_shapes
from model.torch_minigpt import (
    GrammarMiniGPT,
    MiniGPTConfig,
    WeightMismatchError,
    final_softmax,
    load_numpy_weights,
)
from tests.helpers import (
    INTERPRETED,
    PORT_ATOL,
    PORT_RTOL,
    assert_rows_sum_to_one,
    assert_softmax_close,
    batched_logits,
    bits,
    needs_triton,
    npz_arrays,
    random_ids,
)

pytestmark = [pytest.mark.cpu, pytest.mark.usefixtures("one_thread")]

ATOL, RTOL = PORT_ATOL, PORT_RTOL  # the port's contract (tests/helpers/tolerances.py), for every compared tensor
RANDOM_VOCAB = 601  # odd on purpose; close to the trained vocabulary's size

# Forward order, so the first key that disagrees is the layer where a drift starts.
TRACE_KEYS = (
    ["embed"]
    + [f"blocks.{i}{part}" for i in range(numpy_minigpt.N_LAYER) for part in (".attn", ".mlp", "")]
    + ["ln_f", "logits"]
)


# -- weights --------------------------------------------------------------------------------


def random_weights(vocab_size: int, seed: int, config: MiniGPTConfig | None = None) -> dict[str, np.ndarray]:
    """Random weights under the NumPy names, scaled so that every layer matters: LayerNorm
    gains away from 1, biases away from 0, and an LM head that gives peaked distributions
    (the GPT-2 init would make every output nearly uniform and hide errors)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in (expected_shapes(vocab_size, config) if config else expected_shapes(vocab_size)).items():
        if ".ln" in name or name.startswith("ln_"):
            gain_or_bias = name.endswith("weight")
            value = (1.0 + 0.2 * rng.standard_normal(shape)) if gain_or_bias else 0.1 * rng.standard_normal(shape)
        elif name.endswith("bias"):
            value = 0.1 * rng.standard_normal(shape)
        elif name.endswith("emb.weight"):
            value = rng.standard_normal(shape)
        else:
            fan_in = shape[1]
            gain = 3.0 if name == "lm_head.weight" else 1.0
            value = gain * rng.standard_normal(shape) / np.sqrt(fan_in)
        arrays[name] = value.astype(np.float32)
    return arrays


@pytest.fixture(scope="module")
def trained_path():
    path = numpy_minigpt.DEFAULT_WEIGHTS
    assert path.is_file(), f"trained weights missing: {path}"
    return path


@pytest.fixture(scope="module")
def random_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("weights") / "random.npz"
    np.savez(path, **random_weights(RANDOM_VOCAB, seed=1234))
    return path


@pytest.fixture(params=["trained", "random"])
def weights_path(request):
    return request.getfixturevalue(f"{request.param}_path")


def port(path, **kwargs) -> GrammarMiniGPT:
    return GrammarMiniGPT.from_numpy(path, **kwargs)


# -- comparing ------------------------------------------------------------------------------

_worst: dict[str, float] = {}  # trace key -> worst |torch - numpy| over the equivalence tests


@pytest.fixture(scope="module", autouse=True)
def _print_drift_table():
    yield
    if _worst:
        print("\n\nworst |torch - numpy| per layer over all equivalence cases (fp32, CPU, 1 thread)")
        for key in TRACE_KEYS + ["probs"]:
            if key in _worst:
                print(f"  {key:<16} {_worst[key]:.3e}")


def run_both(path, ids: np.ndarray, **kwargs):
    """Both models on the same ids: (numpy trace + probs, torch trace + probs), all NumPy arrays."""
    assert torch.get_num_threads() == 1, "the equivalence contract is stated for one CPU thread"
    reference = NumpyMiniGPT.load(path)
    model = port(path, **kwargs)
    assert not model.training
    np_trace, pt_trace = {}, {}
    reference.logits(ids, trace=np_trace)
    np_trace["probs"] = reference(ids)
    with torch.no_grad():
        model.logits(torch.from_numpy(ids), trace=pt_trace)
        pt_trace["probs"] = model(torch.from_numpy(ids))
    return np_trace, {key: value.numpy() for key, value in pt_trace.items()}


def max_abs_diffs(np_trace, pt_trace) -> dict[str, float]:
    assert set(pt_trace) == set(np_trace) == set(TRACE_KEYS) | {"probs"}
    return {
        key: float(np.max(np.abs(pt_trace[key].astype(np.float64) - np_trace[key]))) for key in TRACE_KEYS + ["probs"]
    }


def first_divergence(np_trace, pt_trace) -> str | None:
    """The first layer, in forward order, whose output is not within the contract's tolerance."""
    for key in TRACE_KEYS:
        if pt_trace[key].shape != np_trace[key].shape or not np.allclose(
            np_trace[key], pt_trace[key], atol=ATOL, rtol=RTOL
        ):
            return key
    return None


def check_equivalence(np_trace, pt_trace, record_manifest, label: str):
    diffs = max_abs_diffs(np_trace, pt_trace)
    for key, value in diffs.items():
        _worst[key] = max(_worst.get(key, 0.0), value)
    outputs_close = all(np.allclose(np_trace[key], pt_trace[key], atol=ATOL, rtol=RTOL) for key in ("logits", "probs"))
    record_manifest(
        "torch_port",
        max_abs_diff_to_numpy_reference=max(diffs["logits"], diffs["probs"]),
        byte_equivalence_at_fp32_cpu="passed" if outputs_close else "failed",
    )
    print(f"\n{label}: max |diff| logits {diffs['logits']:.3e}, probs {diffs['probs']:.3e}")
    drift = first_divergence(np_trace, pt_trace)
    assert drift is None, f"{label}: torch and numpy drift apart from {drift} on (max |diff| per layer: {diffs})"
    for key in ("logits", "probs"):
        np.testing.assert_allclose(pt_trace[key], np_trace[key], atol=ATOL, rtol=RTOL, err_msg=f"{label}: {key}")


# -- architecture and names -----------------------------------------------------------------


def test_config_defaults_match_numpy_model():
    config = MiniGPTConfig(vocab_size=RANDOM_VOCAB)
    assert (config.n_layer, config.n_head, config.d_model, config.d_head, config.context, config.ln_eps) == (
        numpy_minigpt.N_LAYER,
        numpy_minigpt.N_HEAD,
        numpy_minigpt.D_MODEL,
        numpy_minigpt.D_HEAD,
        numpy_minigpt.CONTEXT,
        numpy_minigpt.LN_EPS,
    )
    # eps 1e-5 vs 1e-6 moves outputs by less than the tolerance when activations have unit
    # variance, so the equivalence tests alone could miss a wrong eps: check every LayerNorm.
    model = GrammarMiniGPT(config)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 2 * numpy_minigpt.N_LAYER + 1
    assert all(m.eps == numpy_minigpt.LN_EPS for m in norms)


def test_state_dict_keys_and_shapes_equal_numpy_names():
    model = GrammarMiniGPT(MiniGPTConfig(vocab_size=RANDOM_VOCAB))
    own = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert own == expected_shapes(RANDOM_VOCAB)


def test_mha_variant_maps_every_numpy_name():
    model = GrammarMiniGPT(MiniGPTConfig(vocab_size=RANDOM_VOCAB), attention="mha")
    names = model.numpy_names()
    assert set(names) == set(expected_shapes(RANDOM_VOCAB))
    assert set(names.values()) == set(model.state_dict())
    assert names["blocks.2.attn.qkv.weight"] == "blocks.2.attn.mha.in_proj_weight"
    assert names["blocks.2.attn.proj.bias"] == "blocks.2.attn.mha.out_proj.bias"


# -- loading --------------------------------------------------------------------------------


@pytest.mark.parametrize("attention", ["explicit", "mha"])
def test_loaded_shapes_per_layer(trained_path, attention):
    arrays = npz_arrays(trained_path)
    model = port(trained_path, attention=attention)
    targets = model.state_dict()
    expected = expected_shapes(arrays["tok_emb.weight"].shape[0])
    assert set(arrays) == set(expected)
    for name, own_name in model.numpy_names().items():
        assert tuple(targets[own_name].shape) == arrays[name].shape == expected[name], name
        assert targets[own_name].dtype == torch.float32, name


@pytest.mark.parametrize("attention", ["explicit", "mha"])
def test_storage_holds_exactly_the_numpy_values(weights_path, attention):
    arrays = npz_arrays(weights_path)
    model = port(weights_path, attention=attention)
    targets = model.state_dict()
    for name, own_name in model.numpy_names().items():
        tensor = targets[own_name]
        view = tensor.detach().numpy()
        # The NumPy view reads the tensor's own storage, so this compares what the model computes with.
        assert view.__array_interface__["data"][0] == tensor.data_ptr(), name
        assert view.dtype == np.float32, name
        assert np.array_equal(view, arrays[name]), name


def test_from_numpy_default_is_an_eval_cpu_fp32_module(trained_path):
    model = GrammarMiniGPT.from_numpy()
    assert not model.training and all(not m.training for m in model.modules())
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert np.array_equal(model.lm_head.weight.detach().numpy(), npz_arrays(trained_path)["lm_head.weight"])


NON_SQUARE = [
    "tok_emb.weight",
    "blocks.0.attn.qkv.weight",
    "blocks.1.mlp.fc.weight",
    "blocks.3.mlp.proj.weight",
    "lm_head.weight",
]


@pytest.mark.parametrize("name", NON_SQUARE)
@pytest.mark.parametrize("attention", ["explicit", "mha"])
def test_transposed_weight_is_rejected(random_path, tmp_path, name, attention):
    arrays = npz_arrays(random_path)
    arrays[name] = np.ascontiguousarray(arrays[name].T)
    bad = tmp_path / "transposed.npz"
    np.savez(bad, **arrays)
    model = GrammarMiniGPT(MiniGPTConfig(vocab_size=RANDOM_VOCAB), attention=attention)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(WeightMismatchError, match=rf"wrong shape: {name}\b.*transposed"):
        load_numpy_weights(model, bad)
    # All-or-nothing: a rejected file leaves no parameter half-loaded.
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_missing_extra_and_integer_arrays_are_named(random_path, tmp_path):
    arrays = npz_arrays(random_path)
    del arrays["blocks.2.ln2.bias"]
    arrays["blocks.2.attn.c_attn.weight"] = np.ones((3, 3), np.float32)
    arrays["ln_f.weight"] = np.arange(64, dtype=np.int32)
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    with pytest.raises(WeightMismatchError) as info:
        load_numpy_weights(GrammarMiniGPT(MiniGPTConfig(vocab_size=RANDOM_VOCAB)), bad)
    message = str(info.value)
    assert "missing: blocks.2.ln2.bias" in message
    assert "unexpected: blocks.2.attn.c_attn.weight" in message
    assert "wrong dtype: ln_f.weight" in message


def test_unreadable_files_raise_weights_errors(random_path, tmp_path):
    with pytest.raises(numpy_minigpt.WeightsError, match="not found"):
        GrammarMiniGPT.from_numpy(tmp_path / "absent.npz")
    # An object array can only be read by unpickling, which loading must refuse.
    arrays = npz_arrays(random_path)
    arrays["ln_f.bias"] = np.array([{"payload": 1}], dtype=object)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, **arrays)
    with pytest.raises(numpy_minigpt.WeightsError, match="cannot read"):
        load_numpy_weights(GrammarMiniGPT(MiniGPTConfig(vocab_size=RANDOM_VOCAB)), pickled)


@pytest.mark.parametrize("block", [0, 2])
def test_transposed_square_weight_is_caught_per_layer(random_path, tmp_path, block):
    """An (in, out) d x d matrix has the right shape, so loading cannot see it; the layer-by-layer
    comparison must, and must point at the attention output of that very block."""
    arrays = npz_arrays(random_path)
    name = f"blocks.{block}.attn.proj.weight"
    assert arrays[name].shape[0] == arrays[name].shape[1]
    arrays[name] = np.ascontiguousarray(arrays[name].T)
    trap = tmp_path / "square_transposed.npz"
    np.savez(trap, **arrays)

    ids = random_ids(RANDOM_VOCAB, (2, 16), seed=42)
    assert torch.get_num_threads() == 1
    reference = NumpyMiniGPT.load(random_path)
    model = port(trap)  # loads without complaint
    np_trace, pt_trace = {}, {}
    reference.logits(ids, trace=np_trace)
    with torch.no_grad():
        model.logits(torch.from_numpy(ids), trace=pt_trace)
    pt_trace = {key: value.numpy() for key, value in pt_trace.items()}
    assert first_divergence(np_trace, pt_trace) == f"blocks.{block}.attn"

    # Same comparison with the correct weights: nothing drifts, so the catch above is the transpose.
    model, correct_trace = port(random_path), {}
    with torch.no_grad():
        model.logits(torch.from_numpy(ids), trace=correct_trace)
    assert first_divergence(np_trace, {key: value.numpy() for key, value in correct_trace.items()}) is None


# -- equivalence ----------------------------------------------------------------------------


def test_equivalence_contract(trained_path, record_manifest):
    """The contract case: random ids (2, 16) from seed 42, both models in eval, one thread."""
    V = npz_arrays(trained_path)["tok_emb.weight"].shape[0]
    ids = random_ids(V, (2, 16), seed=42)
    np_trace, pt_trace = run_both(trained_path, ids)
    diffs = max_abs_diffs(np_trace, pt_trace)
    print("\nequivalence contract, trained weights, ids (2, 16) seed 42: max |torch - numpy|")
    for key, value in diffs.items():
        print(f"  {key:<16} {value:.3e}")
    check_equivalence(np_trace, pt_trace, record_manifest, "contract (2, 16) seed 42")


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 16), (4, 32), (1, 32)], ids=lambda s: f"B{s[0]}T{s[1]}")
@pytest.mark.parametrize("seed", [0, 7, 2024])
def test_equivalence_per_layer(weights_path, shape, seed, record_manifest):
    V = npz_arrays(weights_path)["tok_emb.weight"].shape[0]
    ids = random_ids(V, shape, seed)
    np_trace, pt_trace = run_both(weights_path, ids)
    check_equivalence(np_trace, pt_trace, record_manifest, f"{weights_path.stem} {shape} seed {seed}")


@pytest.mark.parametrize("shape", [(2, 16), (3, 32), (1, 1)], ids=lambda s: f"B{s[0]}T{s[1]}")
def test_mha_variant_matches_explicit(weights_path, shape):
    V = npz_arrays(weights_path)["tok_emb.weight"].shape[0]
    ids = torch.from_numpy(random_ids(V, shape, seed=42))
    assert torch.get_num_threads() == 1
    explicit, mha = port(weights_path), port(weights_path, attention="mha")
    explicit_trace, mha_trace = {}, {}
    with torch.no_grad():
        explicit.logits(ids, trace=explicit_trace)
        mha.logits(ids, trace=mha_trace)
        explicit_probs, mha_probs = explicit(ids), mha(ids)
    assert set(mha_trace) == set(explicit_trace) == set(TRACE_KEYS)
    for key in TRACE_KEYS:
        torch.testing.assert_close(
            mha_trace[key], explicit_trace[key], atol=ATOL, rtol=RTOL, msg=lambda m, key=key: f"{key}: {m}"
        )
    torch.testing.assert_close(mha_probs, explicit_probs, atol=ATOL, rtol=RTOL)


def test_mha_variant_matches_numpy(trained_path):
    V = npz_arrays(trained_path)["tok_emb.weight"].shape[0]
    np_trace, pt_trace = run_both(trained_path, random_ids(V, (2, 16), seed=42), attention="mha")
    assert first_divergence(np_trace, pt_trace) is None
    np.testing.assert_allclose(pt_trace["probs"], np_trace["probs"], atol=ATOL, rtol=RTOL)


# -- the final softmax ----------------------------------------------------------------------


def test_final_softmax_on_cpu_is_f_softmax():
    scores = batched_logits(3, 32, RANDOM_VOCAB, seed=3)
    for view in (scores, scores.transpose(0, 1), scores[:, ::2, 5:]):
        for impl in ("auto", "torch"):
            assert torch.equal(bits(final_softmax(view, impl)), bits(F.softmax(view, dim=-1))), impl
    with pytest.raises(ValueError, match="softmax impl"):
        final_softmax(scores, "cupy")
    with pytest.raises(ValueError, match="softmax_impl"):
        GrammarMiniGPT(MiniGPTConfig(vocab_size=RANDOM_VOCAB), softmax_impl="fast")


class _LooksCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the dispatch of final_softmax, checked on the CPU."""

    @property
    def is_cuda(self):
        return True


def test_final_softmax_auto_takes_the_kernel_on_cuda(monkeypatch):
    from kernels import SOFTMAX_KERNELS
    from model.torch_minigpt import LM_HEAD_KERNEL

    calls = []

    def spy(rows):
        calls.append(tuple(rows.shape))
        return F.softmax(rows.as_subclass(torch.Tensor), dim=-1)

    monkeypatch.setitem(SOFTMAX_KERNELS, LM_HEAD_KERNEL, spy)
    scores = batched_logits(2, 5, RANDOM_VOCAB, seed=4).as_subclass(_LooksCuda)
    assert scores.is_cuda
    out = final_softmax(scores, "auto")
    assert calls == [(10, RANDOM_VOCAB)] and out.shape == scores.shape
    final_softmax(scores, "torch")
    assert len(calls) == 1, "impl='torch' must not take the kernel"


@needs_triton
@pytest.mark.skipif(not INTERPRETED, reason="the Triton branch runs on CPU tensors only under the Triton interpreter")
def test_final_softmax_triton_branch_in_interpreter():
    """The CUDA branch's reshaping, exercised through the Triton interpreter on CPU tensors:
    transposed and sliced views must come back with their own shape, F.softmax's values and the
    registry kernel's bits (which differ from F.softmax's here, so a branch that quietly calls
    F.softmax fails)."""
    from kernels import SOFTMAX_KERNELS
    from model.torch_minigpt import LM_HEAD_KERNEL

    scores = batched_logits(3, 5, 97, seed=97)
    for view in (scores, scores.transpose(0, 1), scores[:, ::2, 3:]):
        out = final_softmax(view, "triton")
        assert out.shape == view.shape
        assert_softmax_close(out, view, what="final_softmax through Triton")
        kernel = SOFTMAX_KERNELS[LM_HEAD_KERNEL](view.reshape(-1, view.shape[-1]).contiguous())
        assert torch.equal(bits(out), bits(kernel.view(view.shape)))
        assert not torch.equal(bits(out), bits(F.softmax(view, dim=-1)))


# -- compile / export -----------------------------------------------------------------------


@pytest.mark.slow
def test_torch_compile_matches_eager(trained_path):
    # One static-shape compile of the whole forward (fullgraph: a graph break would be an error),
    # reused for a second input of the same shape. Most of its time is Inductor's one-off set-up
    # (probing the C++ compiler), which its cache keeps for later runs.
    model = port(trained_path)
    compiled = torch.compile(model, dynamic=False, fullgraph=True)
    for seed in (42, 3):
        ids = torch.from_numpy(random_ids(model.config.vocab_size, (2, 16), seed=seed))
        with torch.no_grad():
            torch.testing.assert_close(compiled(ids), model(ids), atol=ATOL, rtol=RTOL)


def test_torch_export_matches_eager(trained_path):
    model = port(trained_path)
    V = model.config.vocab_size
    ids = torch.from_numpy(random_ids(V, (2, 16), seed=42))
    exported = torch.export.export(model, (ids,)).module()
    for seed in (42, 3):
        fresh = torch.from_numpy(random_ids(V, (2, 16), seed=seed))
        with torch.no_grad():
            torch.testing.assert_close(exported(fresh), model(fresh), atol=ATOL, rtol=RTOL)
    # The range check travels inside the exported graph.
    bad = ids.clone()
    bad[1, 3] = V
    with pytest.raises(RuntimeError, match="out of range"):
        exported(bad)


# -- other sizes -----------------------------------------------------------------------------

# Architectures other than the committed one: the port and the reference must agree for any
# size, not only for the numbers they were first written with (odd vocabulary, one head of
# width d, heads of width 4, a short context, a narrow MLP, a layer norm's epsilon of its own).
OTHER_SIZES = {
    "L1-H1-d8": MiniGPTConfig(n_layer=1, n_head=1, d_model=8, context=5, mlp_ratio=2),
    "L2-H3-d24": MiniGPTConfig(n_layer=2, n_head=3, d_model=24, context=9, mlp_ratio=3, ln_eps=0.1),
    "L6-H8-d32": MiniGPTConfig(n_layer=6, n_head=8, d_model=32, context=12),
}


@pytest.mark.parametrize("name", list(OTHER_SIZES))
def test_other_architectures_match_the_reference(name):
    config = OTHER_SIZES[name]
    V = 37
    arrays = random_weights(V, seed=len(name), config=config)
    reference = NumpyMiniGPT(arrays, config)
    model = load_numpy_weights_from(arrays, config)
    ids = random_ids(V, (2, config.context), seed=5)
    with torch.no_grad():
        got = model.logits(torch.from_numpy(ids)).numpy()
    want = reference.logits(ids)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)
    # Both sides refuse what this architecture cannot take: one token past its context, and
    # token ids just outside [0, V) on either side.
    too_long = np.zeros((1, config.context + 1), dtype=np.int64)
    with pytest.raises(ValueError, match="sequence length|context"):
        reference.logits(too_long)
    with pytest.raises(ValueError, match="context"):
        model.logits(torch.from_numpy(too_long))
    for bad in (-1, V):
        ids_bad = ids.copy()
        ids_bad[1, -1] = bad
        with pytest.raises(ValueError, match=rf"\[0, {V}\)"):
            reference.logits(ids_bad)
        with pytest.raises(ValueError, match=rf"\[0, {V}\)"):
            model.logits(torch.from_numpy(ids_bad))


def test_weights_of_another_architecture_are_refused_by_name_and_shape():
    config = OTHER_SIZES["L2-H3-d24"]
    arrays = random_weights(37, seed=2, config=config)
    with pytest.raises(WeightMismatchError, match="blocks.2|missing"):
        load_numpy_weights_from(arrays, MiniGPTConfig(n_layer=3, n_head=3, d_model=24, context=9, mlp_ratio=3))
    with pytest.raises(ValueError, match="divisible"):
        NumpyMiniGPT(arrays, MiniGPTConfig(n_layer=2, n_head=5, d_model=24, context=9, mlp_ratio=3))


def load_numpy_weights_from(arrays, config: MiniGPTConfig) -> GrammarMiniGPT:
    from model.torch_minigpt import load_numpy_arrays

    vocab = arrays["tok_emb.weight"].shape[0]
    return load_numpy_arrays(GrammarMiniGPT(config.with_vocab(vocab)), arrays).eval()


# -- bad input ------------------------------------------------------------------------------

V_SMALL = 50
BAD_INPUTS = {
    "id_equal_to_V": (lambda: torch.tensor([[1, 2, V_SMALL]]), ValueError, r"\[0, 50\)"),
    "negative_id": (lambda: torch.tensor([[3, -1, 4]]), ValueError, r"\[0, 50\)"),
    "longer_than_context": (lambda: torch.zeros(1, 33, dtype=torch.long) + 1, ValueError, "context of 32"),
    "empty_sequence": (lambda: torch.ones(2, 0, dtype=torch.long), ValueError, "T = 0"),
    "float_ids": (lambda: torch.tensor([[1.0, 2.0]]), TypeError, "dtype torch.float32"),
    "bool_ids": (lambda: torch.tensor([[True, False]]), TypeError, "dtype torch.bool"),
    "rank_1": (lambda: torch.tensor([1, 2, 3]), ValueError, r"\(B, T\)"),
    "rank_3": (lambda: torch.ones(1, 2, 3, dtype=torch.long), ValueError, r"\(B, T\)"),
    "numpy_array": (lambda: np.ones((1, 3), np.int64), TypeError, "torch.Tensor"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
@pytest.mark.parametrize("entry", ["forward", "logits"])
def test_bad_input_fails_before_indexing(case, entry):
    make, error, pattern = BAD_INPUTS[case]
    model = GrammarMiniGPT(MiniGPTConfig(vocab_size=V_SMALL)).eval()
    looked_up = []
    model.tok_emb.register_forward_pre_hook(lambda module, args: looked_up.append(True))
    with pytest.raises(error, match=pattern):
        getattr(model, entry)(make())
    assert not looked_up, "the embedding was indexed before the input was validated"


def test_valid_int32_and_edge_ids_are_accepted():
    model = GrammarMiniGPT(MiniGPTConfig(vocab_size=V_SMALL)).eval()
    ids = torch.tensor([[0, V_SMALL - 1] * 16], dtype=torch.int32)  # T = 32, the full context
    with torch.no_grad():
        probs = model(ids)
    assert probs.shape == (1, 32, V_SMALL)
    assert_rows_sum_to_one(probs, what="GrammarMiniGPT on int32 and edge ids")
