"""NumpyMiniGPT: float64 finite-difference gradient checks, forward semantics, weight
loading/validation, and what the committed model has learned."""

import math

import numpy as np
import pytest
import torch

from model import grammar
from model import numpy_minigpt as nm
from model.numpy_minigpt import NumpyMiniGPT, WeightsError, expected_shapes
from model.tokenizer import Tokenizer
from model.train import verb_form_accuracy
from tests.helpers import check_softmax

pytestmark = pytest.mark.cpu

# Central differences in float64 with this step are accurate to ~1e-9 relative, so a
# 1e-6 relative tolerance leaves room for rounding yet catches any real mistake
# (see test_gradient_check_detects_a_small_error).
FD_EPS = 1e-5
RTOL = 1e-6


def _rng(seed=0):
    return np.random.default_rng(seed)


def numeric_grad(f, arr, idxs, eps=FD_EPS):
    out = []
    for idx in idxs:
        old = arr[idx]
        arr[idx] = old + eps
        fp = f()
        arr[idx] = old - eps
        fm = f()
        arr[idx] = old
        out.append((fp - fm) / (2 * eps))
    return np.array(out)


def sample_indices(shape, n, rng):
    """All indices of a small array, else `n` random ones."""
    size = int(np.prod(shape))
    flat = np.arange(size) if size <= n else rng.choice(size, n, replace=False)
    return [np.unravel_index(i, shape) for i in flat]


def assert_grad_close(analytic, numeric, what):
    scale = max(1.0, float(np.abs(numeric).max()))
    np.testing.assert_allclose(
        analytic, numeric, rtol=RTOL, atol=RTOL * scale * 1e-2, err_msg=f"gradient mismatch for {what}"
    )


def check_layer(forward, backward, inputs, rng, n=40):
    """Check d(sum(out * R))/d(each input) against central differences."""
    out = forward()
    R = rng.normal(size=out.shape)
    grads = backward(R)

    def loss():
        return float((forward() * R).sum())

    for name, arr in inputs.items():
        idxs = sample_indices(arr.shape, n, rng)
        ana = np.array([grads[name][i] for i in idxs])
        assert_grad_close(ana, numeric_grad(loss, arr, idxs), name)


# ----------------------------------------------------------------------- per-layer gradients
def test_linear_gradients():
    rng = _rng(1)
    x, w, b = rng.normal(size=(2, 3, 5)), rng.normal(size=(4, 5)), rng.normal(size=4)

    def backward(dy):
        dx, dw, db = nm.linear_backward(dy, x, w)
        return {"x": dx, "w": dw, "b": db}

    check_layer(lambda: nm.linear_forward(x, w, b)[0], backward, {"x": x, "w": w, "b": b}, rng)


def test_layernorm_gradients():
    rng = _rng(2)
    x = rng.normal(size=(2, 3, 8)) * 3 + 1
    g, b = 1 + 0.3 * rng.normal(size=8), rng.normal(size=8)

    def backward(dy):
        _, cache = nm.layernorm_forward(x, g, b)
        dx, dg, db = nm.layernorm_backward(dy, cache)
        return {"x": dx, "g": dg, "b": db}

    check_layer(lambda: nm.layernorm_forward(x, g, b)[0], backward, {"x": x, "g": g, "b": b}, rng)


def test_gelu_gradients():
    rng = _rng(3)
    x = np.concatenate([rng.normal(size=20) * 2, [-6.0, -3.0, 0.0, 3.0, 6.0]])
    check_layer(
        lambda: nm.gelu_forward(x)[0], lambda dy: {"x": nm.gelu_backward(dy, nm.gelu_forward(x)[1])}, {"x": x}, rng
    )


def _random_block_params(rng, prefix=""):
    d = nm.D_MODEL
    p = {}
    for name, shape in expected_shapes(7).items():
        if not name.startswith("blocks.0."):
            continue
        short = name[len("blocks.0.") :]
        if short.startswith("ln"):
            base = 1.0 if short.endswith("weight") else 0.0
            p[prefix + short] = base + 0.2 * rng.normal(size=shape)
        elif short.endswith("bias"):
            p[prefix + short] = 0.1 * rng.normal(size=shape)
        else:  # large enough that attention is far from uniform
            p[prefix + short] = rng.normal(size=shape) * 1.2 / math.sqrt(shape[1])
    assert p[prefix + "attn.qkv.weight"].shape == (3 * d, d)
    return p


@pytest.mark.parametrize("layer, seed, T", [("attn", 4, 5), ("mlp", 5, 4)])
def test_sublayer_gradients(layer, seed, T):
    forward, backward_of = {
        "attn": (nm.attention_forward, nm.attention_backward),
        "mlp": (nm.mlp_forward, nm.mlp_backward),
    }[layer]
    rng = _rng(seed)
    prefix = layer + "."
    p = {k[len(prefix) :]: v for k, v in _random_block_params(rng).items() if k.startswith(prefix)}
    x = rng.normal(size=(2, T, nm.D_MODEL))

    def backward(dy):
        _, cache = forward(x, p)
        dx, g = backward_of(dy, cache, p)
        return {"x": dx, **g}

    check_layer(lambda: forward(x, p)[0], backward, {"x": x, **p}, rng)


def test_block_gradients():
    rng = _rng(6)
    p = _random_block_params(rng)
    x = rng.normal(size=(2, 5, nm.D_MODEL))

    def backward(dy):
        _, cache, _, _ = nm.block_forward(x, p)
        dx, g = nm.block_backward(dy, cache, p)
        return {"x": dx, **g}

    check_layer(lambda: nm.block_forward(x, p)[0], backward, {"x": x, **p}, rng, n=25)


def test_cross_entropy_gradients():
    rng = _rng(7)
    logits = rng.normal(size=(2, 4, 9)) * 3
    logits[0, 0, 2] = 40.0  # an outlier logit: log-softmax must stay finite
    targets = rng.integers(0, 9, size=(2, 4))
    mask = np.array([[1, 1, 1, 0], [1, 0, 1, 1]], dtype=np.float64)
    loss, cache = nm.cross_entropy_forward(logits, targets, mask)
    assert np.isfinite(loss)
    ana = nm.cross_entropy_backward(cache)
    assert np.all(ana[0, 3] == 0) and np.all(ana[1, 1] == 0)  # masked positions get no gradient
    idxs = sample_indices(logits.shape, 100, rng)
    num = numeric_grad(lambda: nm.cross_entropy_forward(logits, targets, mask)[0], logits, idxs)
    assert_grad_close(np.array([ana[i] for i in idxs]), num, "logits")


# ----------------------------------------------------------------------- whole-model gradient
def _random_model(vocab=11, seed=8):
    rng = _rng(seed)
    params = {}
    for name, shape in expected_shapes(vocab).items():
        if ".ln" in name or name.startswith("ln_f"):
            params[name] = (1.0 if name.endswith("weight") else 0.0) + 0.2 * rng.normal(size=shape)
        elif name.endswith("bias"):
            params[name] = 0.1 * rng.normal(size=shape)
        else:
            params[name] = rng.normal(size=shape) * (0.5 if "emb" in name else 1.0 / math.sqrt(shape[1]))
    return NumpyMiniGPT(params)


def _whole_model_check(model, analytic_scale=1.0, n_per_param=4):
    rng = _rng(9)
    ids = rng.integers(0, model.vocab_size, size=(2, 7))
    targets = rng.integers(0, model.vocab_size, size=(2, 7))
    mask = (rng.random((2, 7)) > 0.25).astype(np.float64)
    _, grads = model.loss_and_grads(ids, targets, mask)

    def loss():
        return model.loss_and_grads(ids, targets, mask)[0]

    assert set(grads) == set(model.params)
    for name, arr in model.params.items():
        idxs = sample_indices(arr.shape, n_per_param, rng)
        if name == "tok_emb.weight":  # rows of tokens that occur, plus one that does not
            absent = min(set(range(model.vocab_size)) - set(ids.ravel()))
            idxs = [(int(ids[0, 0]), 3), (int(ids[1, 4]), 17), (absent, 5)]
        ana = np.array([grads[name][i] for i in idxs]) * analytic_scale
        assert_grad_close(ana, numeric_grad(loss, arr, idxs), name)


def test_whole_model_gradients_float64():
    model = _random_model()
    assert model.dtype == np.float64
    _whole_model_check(model)


def test_gradient_check_detects_a_small_error():
    """The tolerance is tight enough that a 0.1% error in the backward fails."""
    with pytest.raises(AssertionError, match="gradient mismatch"):
        _whole_model_check(_random_model(), analytic_scale=1.001)


# ----------------------------------------------------------------------- forward semantics
def _naive_logits(model, ids):
    """Position-by-position loops over heads, written independently of the vectorised code."""
    p = {k: v.astype(np.float64) for k, v in model.params.items()}

    def ln(v, g, b):
        return (v - v.mean()) / math.sqrt(v.var() + nm.LN_EPS) * g + b

    def gelu(v):
        return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))

    B, T = ids.shape
    d, H, dh = nm.D_MODEL, nm.N_HEAD, nm.D_HEAD
    out = np.zeros((B, T, model.vocab_size))
    for b in range(B):
        xs = [p["tok_emb.weight"][ids[b, t]] + p["pos_emb.weight"][t] for t in range(T)]
        for i in range(nm.N_LAYER):
            q_ = f"blocks.{i}."
            h = [ln(x, p[q_ + "ln1.weight"], p[q_ + "ln1.bias"]) for x in xs]
            qkv = [p[q_ + "attn.qkv.weight"] @ v + p[q_ + "attn.qkv.bias"] for v in h]
            new = []
            for t in range(T):
                heads = []
                for hd in range(H):
                    q = qkv[t][hd * dh : (hd + 1) * dh]
                    ks = [qkv[s][d + hd * dh : d + (hd + 1) * dh] for s in range(t + 1)]
                    vs = [qkv[s][2 * d + hd * dh : 2 * d + (hd + 1) * dh] for s in range(t + 1)]
                    sc = np.array([q @ k for k in ks]) / math.sqrt(dh)
                    w = np.exp(sc - sc.max())
                    w /= w.sum()
                    heads.append(sum(wi * vi for wi, vi in zip(w, vs, strict=True)))
                a = p[q_ + "attn.proj.weight"] @ np.concatenate(heads) + p[q_ + "attn.proj.bias"]
                new.append(xs[t] + a)
            xs = new
            for t in range(T):
                h2 = ln(xs[t], p[q_ + "ln2.weight"], p[q_ + "ln2.bias"])
                m = p[q_ + "mlp.proj.weight"] @ gelu(p[q_ + "mlp.fc.weight"] @ h2 + p[q_ + "mlp.fc.bias"])
                xs[t] = xs[t] + m + p[q_ + "mlp.proj.bias"]
        for t in range(T):
            out[b, t] = p["lm_head.weight"] @ ln(xs[t], p["ln_f.weight"], p["ln_f.bias"]) + p["lm_head.bias"]
    return out


def test_constants_match_the_contract():
    assert (nm.N_LAYER, nm.N_HEAD, nm.D_MODEL, nm.D_HEAD, nm.CONTEXT, nm.LN_EPS) == (4, 4, 64, 16, 32, 1e-5)
    shapes = expected_shapes(600)
    assert shapes["blocks.3.attn.qkv.weight"] == (192, 64)
    assert shapes["blocks.0.mlp.proj.weight"] == (64, 256)
    assert shapes["lm_head.weight"] == (600, 64) and shapes["pos_emb.weight"] == (32, 64)
    assert len(shapes) == 2 + 12 * 4 + 4


def test_forward_matches_naive_loops():
    model = _random_model(vocab=13, seed=10)
    ids = _rng(11).integers(0, 13, size=(2, 6))
    np.testing.assert_allclose(model.logits(ids), _naive_logits(model, ids), rtol=1e-10, atol=1e-10)


def test_probabilities_and_dtypes():
    model = NumpyMiniGPT.init(50, seed=3)
    ids = _rng(12).integers(0, 50, size=(3, nm.CONTEXT))
    probs = model(ids)
    assert probs.dtype == np.float32 and probs.shape == (3, nm.CONTEXT, 50)
    # The model's own float32 softmax against the float64 one of its logits, by the suite's rule.
    check_softmax(torch.from_numpy(probs), torch.from_numpy(model.logits(ids)), what="NumpyMiniGPT probabilities")
    # float32 and float64 runs of the same weights agree to float32 precision
    np.testing.assert_allclose(model.logits(ids), model.astype(np.float64).logits(ids), rtol=1e-4, atol=1e-5)


def test_softmax_survives_large_logits():
    """The model's softmax subtracts each row's max: logits of 1000 give the probabilities of
    logits of 0, not inf / inf."""
    x = np.array([[1000.0, 999.0, -1000.0], [0.0, -1.0, -2000.0]], dtype=np.float32)
    got = nm.softmax(x)
    np.testing.assert_allclose(got[0], got[1], rtol=1e-6)
    np.testing.assert_allclose(got[0, :2], [1 / (1 + math.exp(-1)), 1 / (1 + math.e)], rtol=1e-6)


def test_init_is_gpt2s():
    """N(0, 0.02) weights, residual projections (attention's and the MLP's) at 0.02 / sqrt(2L),
    zero biases, layer norms at (1, 0)."""
    model = NumpyMiniGPT.init(600, seed=5)
    L = model.config.n_layer
    seen = set()
    for name, value in model.params.items():
        if name.startswith("ln") or ".ln" in name:
            want = 1.0 if name.endswith("weight") else 0.0
            assert np.all(value == want), name
        elif name.endswith("bias"):
            assert np.all(value == 0.0), name
        else:
            std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
            assert abs(float(value.std()) / std - 1) < 0.1 and abs(float(value.mean())) < 0.2 * std, name
            seen.add("proj" if name.endswith("proj.weight") else "other")
    assert sum(name.endswith("proj.weight") for name in model.params) == 2 * L and seen == {"proj", "other"}


def test_causality():
    model = _random_model(vocab=13, seed=13)
    ids = _rng(14).integers(0, 13, size=(1, 10))
    changed = ids.copy()
    changed[0, 6:] = (changed[0, 6:] + 1) % 13
    a, b = model.logits(ids), model.logits(changed)
    np.testing.assert_array_equal(a[:, :6], b[:, :6])
    assert np.abs(a[:, 6:] - b[:, 6:]).max() > 1e-3


def test_trace_contents():
    model = _random_model(vocab=13, seed=15)
    ids = _rng(16).integers(0, 13, size=(2, 5))
    trace = {}
    logits = model.logits(ids, trace=trace)
    keys = {"embed", "ln_f", "logits"} | {f"blocks.{i}{s}" for i in range(4) for s in ("", ".attn", ".mlp")}
    assert set(trace) == keys
    prev = trace["embed"]
    np.testing.assert_allclose(prev, model.params["tok_emb.weight"][ids] + model.params["pos_emb.weight"][:5])
    for i in range(4):
        assert trace[f"blocks.{i}"].shape == (2, 5, nm.D_MODEL)
        np.testing.assert_allclose(
            trace[f"blocks.{i}"], prev + trace[f"blocks.{i}.attn"] + trace[f"blocks.{i}.mlp"], rtol=1e-12, atol=1e-12
        )
        prev = trace[f"blocks.{i}"]
    np.testing.assert_array_equal(trace["logits"], logits)


@pytest.mark.parametrize(
    "ids,match",
    [
        (np.zeros((1, nm.CONTEXT + 1), dtype=np.int64), "sequence length"),
        (np.zeros((4,), dtype=np.int64), r"shape \(B, T\)"),
        (np.full((1, 3), 0.5), "integer"),
        (np.array([[1, 99]]), "token ids"),
        (np.array([[1, -1]]), "token ids"),
    ],
)
def test_bad_ids_are_rejected(ids, match):
    with pytest.raises(ValueError, match=match):
        NumpyMiniGPT.init(13).logits(ids)


# ----------------------------------------------------------------------- loading / validation
@pytest.fixture
def saved(tmp_path):
    model = NumpyMiniGPT.init(37, seed=1)
    path = tmp_path / "w.npz"
    model.save(path)
    return model, path


def _resave(path, params):
    np.savez(path, **params)
    return path


def test_save_load_roundtrip(saved):
    model, path = saved
    back = NumpyMiniGPT.load(path)
    assert back.params.keys() == model.params.keys()
    for k in model.params:
        np.testing.assert_array_equal(back.params[k], model.params[k])
        assert back.params[k].dtype == np.float32


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda p: p.pop("blocks.2.mlp.fc.bias"), "missing parameter 'blocks.2.mlp.fc.bias'"),
        (lambda p: p.pop("tok_emb.weight"), "missing parameter 'tok_emb.weight'"),
        (
            lambda p: p.__setitem__("blocks.4.ln1.weight", np.ones(64, np.float32)),
            "unexpected parameter 'blocks.4.ln1.weight'",
        ),
        (
            lambda p: p.__setitem__("blocks.1.attn.qkv.weight", np.ones((192, 65), np.float32)),
            r"'blocks.1.attn.qkv.weight' has shape \(192, 65\), expected \(192, 64\)",
        ),
        (lambda p: p.__setitem__("lm_head.weight", np.ones((36, 64), np.float32)), "'lm_head.weight' has shape"),
        (lambda p: p.__setitem__("ln_f.bias", p["ln_f.bias"].astype(np.float64)), "'ln_f.bias' has dtype float64"),
        (
            lambda p: p.__setitem__("tok_emb.weight", p["tok_emb.weight"].astype(np.float16)),
            "'tok_emb.weight' has dtype float16",
        ),
        (
            lambda p: p.__setitem__("pos_emb.weight", p["pos_emb.weight"].astype(np.int32)),
            "'pos_emb.weight' has dtype int32",
        ),
        (lambda p: p.__setitem__("ln_f.weight", np.array([None] * 64, dtype=object)), "'ln_f.weight' .*unreadable"),
    ],
)
def test_load_rejects_bad_parameters(saved, mutate, match):
    model, path = saved
    params = dict(model.params)
    mutate(params)
    with pytest.raises(WeightsError, match=match):
        NumpyMiniGPT.load(_resave(path, params))


def test_load_rejects_all_float64(saved):
    model, path = saved
    _resave(path, {k: v.astype(np.float64) for k, v in model.params.items()})
    with pytest.raises(WeightsError, match="dtype float64, expected float32"):
        NumpyMiniGPT.load(path)


def test_load_rejects_unreadable_files(saved, tmp_path):
    _, path = saved
    with pytest.raises(WeightsError, match="not found"):
        NumpyMiniGPT.load(tmp_path / "nope.npz")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"this is not a zip archive" * 10)
    with pytest.raises(WeightsError, match="cannot read weights file"):
        NumpyMiniGPT.load(garbage)
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(WeightsError, match="cannot read weights file"):
        NumpyMiniGPT.load(truncated)


# ----------------------------------------------------------------------- the committed model
@pytest.fixture(scope="module")
def trained():
    return NumpyMiniGPT.load(), Tokenizer.load()


def test_committed_weights(trained):
    model, tok = trained
    assert model.vocab_size == tok.vocab_size
    assert nm.DEFAULT_WEIGHTS.stat().st_size < 2_000_000
    assert all(v.dtype == np.float32 for v in model.params.values())


@pytest.mark.parametrize(
    "prompt,form",
    [
        ("Yesterday I", "past"),
        ("Tomorrow I will", "base"),
        ("Every day she", "s"),
        ("Right now we are", "ing"),
        ("Two weeks ago my brother", "past"),
        ("Usually they", "base"),
        ("At the moment the dog is", "ing"),
    ],
)
def test_top5_have_the_right_verb_form(trained, prompt, form):
    model, tok = trained
    probs = model(np.array([[tok.bos_id] + tok.encode(prompt)]))[0, -1]
    top = np.argsort(-probs)[:5]
    got = [(tok.id_to_token[i], tok.verb_form(int(i))) for i in top]
    assert all(f == form for _, f in got), f"{prompt!r}: {got}"
    assert set(top) <= tok.tokens_of_form(form)


def test_held_out_verb_form_accuracy(trained, record_manifest):
    model, tok = trained
    seen = {s.tokens for s in grammar.generate_corpus(30000, seed=0)}  # the training corpus
    held_out = [s for s in grammar.generate_corpus(2500, seed=2024) if s.tokens not in seen][:2000]
    assert len(held_out) >= 1500
    acc = verb_form_accuracy(model, tok, held_out)
    n_pos = sum(len(s.verb_positions) for s in held_out)
    print(f"verb-form accuracy: {acc:.4f} over {n_pos} verb positions in {len(held_out)} held-out sentences")
    record_manifest("numpy_model", verb_form_accuracy=acc)
    assert acc >= 0.98
