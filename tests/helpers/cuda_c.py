"""The CUDA C kernels: what an offline build must show, and the slice geometry of their loads
(SliceGeom in kernels/cuda/), replayed in Python."""

from __future__ import annotations


def assert_builds_clean(report: dict, expected, source: str, spills=None) -> None:
    """Every entry point the dispatcher launches (`expected`) is in ptxas's `report` for `source`,
    with no stack frame, no spill and at most 64 registers (the launch bounds promise >= 1024
    resident threads per SM); `spills`: {name: bytes} its stack and spills may reach instead."""
    spills = spills or {}
    missing = sorted(set(expected) - set(report))
    assert not missing, f"{source}: entry points the dispatcher launches were not compiled: {missing}"
    for name in expected:
        r = report[name]
        assert {"registers", "stack_bytes", "spill_stores", "spill_loads"} <= set(r), (name, r)
        most = spills.get(name, 0)
        assert r["stack_bytes"] <= most, f"{name}: {r['stack_bytes']} bytes stack frame (arrays in local memory)"
        assert r["spill_stores"] <= most and r["spill_loads"] <= most, f"{name} spills: {r} (may: {most} bytes)"
        assert r["registers"] <= 64, f"{name} uses {r['registers']} registers"


def slice_geometry(addr_elems: int, length: int, vec: int):
    """SliceGeom: head up to the 16-byte boundary, body vectors, tail (address in elements).
    Returns (head, body vectors, the tail's first index, tail)."""
    mis = addr_elems % vec
    head = min((vec - mis) % vec, length)
    nvec = (length - head) // vec
    tail0 = head + nvec * vec
    return head, nvec, tail0, length - tail0
