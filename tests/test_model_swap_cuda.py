"""Swapping the model onto the GPU, and its last softmax onto the Triton kernel, must not change
what the model predicts: CUDA against CPU, and Triton against F.softmax on the same GPU.

Run with `-s` to see the worst differences and the top-5 after "Yesterday I"."""

import numpy as np
import pytest
import torch

from model.grammar import TENSE_PROMPTS
from model.tokenizer import Tokenizer
from model.torch_minigpt import GrammarMiniGPT, final_softmax
from tests.helpers import assert_outputs_agree, assert_softmax_close, batched_logits, bits

pytestmark = [pytest.mark.cuda, pytest.mark.quick]

CUDA_VS_CPU_ATOL = 1e-3  # different matmul kernels and reduction orders, TF32 off

# Every tense of the grammar: past, habitual (time phrase or adverb), future, and now.
PROMPTS = TENSE_PROMPTS  # every tense of the grammar: past, habitual, future, now
CONTRACT_INPUT = "random ids (2, 16) seed 42"


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.load()


def prompt_ids(tokenizer, text: str) -> torch.Tensor:
    """(1, T) ids the way training saw sentences: <bos> first, no <eos>."""
    return torch.tensor([[tokenizer.bos_id] + tokenizer.encode(text)], dtype=torch.long)


@pytest.fixture(scope="module")
def runs(ieee_fp32, tokenizer):
    """label -> CPU tensors of: CPU logits / probs (F.softmax), CUDA logits, CUDA probs through
    the default dispatch (Triton) and through F.softmax forced on the GPU."""
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CPU side computes as in the CPU equivalence tests
    try:
        return _run_all(tokenizer)
    finally:
        torch.set_num_threads(saved_threads)


def _run_all(tokenizer):
    assert torch.get_num_threads() == 1
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    cpu = GrammarMiniGPT.from_numpy()
    gpu_triton = GrammarMiniGPT.from_numpy().to("cuda")
    gpu_torch = GrammarMiniGPT.from_numpy(softmax_impl="torch").to("cuda")
    V = cpu.config.vocab_size
    inputs = {CONTRACT_INPUT: torch.from_numpy(np.random.default_rng(42).integers(0, V, (2, 16), dtype=np.int64))}
    inputs.update({text: prompt_ids(tokenizer, text) for text in PROMPTS})
    results = {}
    with torch.no_grad():
        for label, ids in inputs.items():
            on_gpu = ids.to("cuda")
            results[label] = {
                "cpu_logits": cpu.logits(ids),
                "cpu_probs": cpu(ids),
                "cuda_logits": gpu_triton.logits(on_gpu).cpu(),
                "cuda_probs": gpu_triton(on_gpu).cpu(),
                "cuda_torch_probs": gpu_torch(on_gpu).cpu(),
            }
    return results


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def next_token(probs: torch.Tensor) -> int:
    """The prediction after the last prompt token."""
    return int(probs[0, -1].argmax())


def top2_margin(logits: torch.Tensor) -> float:
    """Logit gap between the first and second choice after the prompt: how close a tie it is."""
    first, second = logits[0, -1].topk(2).values
    return float(first - second)


def test_cuda_forward_matches_cpu(runs, record_manifest):
    worst_logits = max(max_abs(r["cuda_logits"], r["cpu_logits"]) for r in runs.values())
    worst_probs = max(max_abs(r["cuda_probs"], r["cpu_probs"]) for r in runs.values())
    top1_changed = [
        text for text in PROMPTS if next_token(runs[text]["cuda_probs"]) != next_token(runs[text]["cpu_probs"])
    ]
    record_manifest(
        "torch_port",
        cuda_vs_cpu_max_abs_diff_logits=worst_logits,
        cuda_vs_cpu_max_abs_diff_probs=worst_probs,
        kernel_swap_changes_top1_token=bool(top1_changed),
    )
    print("\nCUDA (Triton softmax) vs CPU (F.softmax), TF32 off: max |diff|")
    print(f"  {'input':<28} {'logits':>10} {'probs':>10}")
    for label, r in runs.items():
        print(
            f"  {label:<28} {max_abs(r['cuda_logits'], r['cpu_logits']):10.3e} "
            f"{max_abs(r['cuda_probs'], r['cpu_probs']):10.3e}"
        )
    print(f"  {'worst':<28} {worst_logits:10.3e} {worst_probs:10.3e}")

    for label, r in runs.items():
        for what in ("logits", "probs"):
            torch.testing.assert_close(
                r[f"cuda_{what}"],
                r[f"cpu_{what}"],
                atol=CUDA_VS_CPU_ATOL,
                rtol=0,
                msg=lambda m, label=label, what=what: f"{label} {what}: {m}",
            )
    margins = {text: top2_margin(runs[text]["cpu_logits"]) for text in top1_changed}
    assert not top1_changed, f"next token differs between CUDA and CPU after (CPU top-2 logit gap): {margins}"


def test_triton_softmax_matches_f_softmax_on_cuda(runs, record_manifest):
    top1_changed = [
        text for text in PROMPTS if next_token(runs[text]["cuda_probs"]) != next_token(runs[text]["cuda_torch_probs"])
    ]
    worst = max(max_abs(r["cuda_probs"], r["cuda_torch_probs"]) for r in runs.values())
    record_manifest("torch_port", kernel_swap_changes_top1_token=bool(top1_changed))
    print(f"\nTriton vs F.softmax on CUDA, same logits: worst max |diff| on probs {worst:.3e}")

    for label, r in runs.items():
        assert_outputs_agree(r["cuda_probs"], r["cuda_torch_probs"], r["cuda_logits"], what=label)
    margins = {text: top2_margin(runs[text]["cuda_logits"]) for text in top1_changed}
    assert not top1_changed, f"next token differs between Triton and F.softmax after (top-2 logit gap): {margins}"


def test_yesterday_top5_are_past_simple_on_cuda(runs, tokenizer):
    past = tokenizer.tokens_of_form("past")
    assert past, "the tokenizer knows no past-simple verbs"
    top5 = {}
    for path in ("cpu_probs", "cuda_probs"):
        probs, ids = runs["Yesterday I"][path][0, -1].topk(5)
        top5[path] = [(int(i), float(p)) for i, p in zip(ids, probs, strict=True)]
    print('\ntop-5 after "Yesterday I"')
    for path, entries in top5.items():
        shown = ", ".join(f"{tokenizer.id_to_token[i]} {p:.4f}" for i, p in entries)
        print(f"  {path.removesuffix('_probs'):<5} {shown}")
    wrong = [(tokenizer.id_to_token[i], tokenizer.verb_form(i)) for i, _ in top5["cuda_probs"] if i not in past]
    assert not wrong, f"top-5 after 'Yesterday I' on CUDA holds words that are not past simple: {wrong}"


def test_auto_dispatch_runs_triton_on_cuda(monkeypatch):
    from kernels import SOFTMAX_KERNELS
    from model.torch_minigpt import LM_HEAD_KERNEL

    assert LM_HEAD_KERNEL == "triton"
    calls = []
    real = SOFTMAX_KERNELS[LM_HEAD_KERNEL]

    def spy(x, *args, **kwargs):
        calls.append((tuple(x.shape), x.is_contiguous()))
        return real(x, *args, **kwargs)

    monkeypatch.setitem(SOFTMAX_KERNELS, LM_HEAD_KERNEL, spy)
    scores = batched_logits(2, 16, 257, seed=5, device="cuda")
    final_softmax(scores, "torch")
    assert calls == [], "impl='torch' must not reach the Triton kernel"
    final_softmax(scores)
    assert calls == [((32, 257), True)], "impl='auto' on CUDA must hand the kernel one contiguous (B*T, V) matrix"


@pytest.mark.parametrize("view", ["transposed", "sliced", "strided_rows", "contiguous"])
def test_final_softmax_non_contiguous_cuda(view):
    if view == "transposed":
        base = batched_logits(16, 2, 781, seed=1, device="cuda")
        scores = base.transpose(0, 1)  # (B, T, V) with B and T strides swapped
    elif view == "sliced":
        base = batched_logits(2, 16, 800, seed=2, device="cuda")
        scores = base[..., 7:788]  # rows padded in memory, V = 781
    elif view == "strided_rows":
        base = batched_logits(2, 32, 781, seed=3, device="cuda")
        scores = base[:, ::2]  # every other position
    else:
        base = batched_logits(2, 16, 781, seed=4, device="cuda")
        scores = base
    assert scores.is_contiguous() == (view == "contiguous")
    before = bits(base).clone()
    for impl in ("auto", "triton"):
        out = final_softmax(scores, impl)
        assert out.shape == scores.shape and out.device.type == "cuda"
        assert_softmax_close(out, scores, what=f"final_softmax {impl} on a {view} view")
        assert out.data_ptr() != scores.data_ptr()
    assert torch.equal(bits(base), before), "the softmax wrote into its input"
