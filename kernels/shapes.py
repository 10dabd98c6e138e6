"""Shapes that several parts of the suite must agree on, written once."""

# The lab's grid of (B, V): the autotune shapes, the lab benchmark grid and the lab gates.
LAB_SHAPES = ((64, 600), (512, 600), (4096, 600))
# The lab's headline point (B, V, dtype name): the manifest's per-kernel figures and the roofline.
LAB_POINT = (512, 600, "float32")


def matrix_bytes(B: int, V: int, itemsize: int, passes: int = 2) -> int:
    """Bytes a softmax moves through device memory when it passes over the (B, V) matrix
    `passes` times (2: one read and one write, the least any softmax can move)."""
    return passes * B * V * itemsize
