"""The suite's own machinery, one job per module, each tested on the CPU by
tests/test_suite_<module>.py. conftest.py only wires these into pytest's hooks.

    gpus        counting and naming GPUs without CUDA, pinning xdist workers
    markers     the one-platform-marker rule and what a collected run may do without a GPU
    records     what tests and benchmarks hand over for the manifest, and how it combines
    devicetime  the three clocks: device time, per-call wall time, CUDA-graph replay
    manifest    building, merging, validating and writing reports/manifest.json
    figures     roofline.png, bandwidth.png, call_modes.png from a manifest
    gate        the GPU regression gate: paired rounds, baselines per GPU model, noise
    merge       one report from the results of several machines (python -m tests.suite.merge)
    coverage    every expected cell of the coverage matrix ran, checked at the session's end

    synthetic   made-up records for testing the above on the CPU
    testing     running pytest in a subprocess on tests/harness_cases/
"""
