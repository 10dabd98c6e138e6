"""Completeness of the coverage matrix across processes: every expected cell ran.

A cell is (kernel, path, layout, dtype) on a platform ("cpu" or "cuda"). Each matrix case
records the cell it ran (`record_cell`), once its kernel has run; the matrix's check test, when
the whole matrix is selected, records the cells it expects (`expect`). Both travel as
user_properties of the test reports, which reach the pytest process that writes the reports:
under xdist that is the controller, which sees every worker's. At the end of the session the
controller compares them (`Tracker.result`): an expected cell no case ran (skipped, failed
before its kernel ran, or lost with its worker) fails the session and is named.
"""

from dataclasses import dataclass, field

CELL_KEY = "coverage_cell"
EXPECTED_KEY = "coverage_expected"


def record_cell(node, platform: str, cell: tuple) -> None:
    """Record that this test ran `cell` on `platform` (call it after the kernel ran)."""
    node.user_properties.append((CELL_KEY, [platform, *map(str, cell)]))


def expect(node, platform: str, cells) -> None:
    """Record the cells the session must have run on `platform` (the whole matrix was selected)."""
    node.user_properties.append((EXPECTED_KEY, [platform, sorted([list(map(str, c)) for c in cells])]))


def missing_cells(expected, covered) -> str:
    """'' when covered holds every expected cell, else a line naming each missing one."""
    missing = sorted(set(map(tuple, expected)) - set(map(tuple, covered)))
    return "".join("\n  " + " / ".join(cell) for cell in missing)


@dataclass
class CoverageResult:
    checked: dict = field(default_factory=dict)  # platform -> number of expected cells
    missing: dict = field(default_factory=dict)  # platform -> the missing-cells text

    @property
    def failed(self) -> bool:
        return any(self.missing.values())

    def lines(self) -> list[str]:
        lines = []
        for platform, n in sorted(self.checked.items()):
            gaps = self.missing.get(platform)
            if gaps:
                count = gaps.count("\n")
                lines.append(f"coverage matrix ({platform}): {count} of {n} expected cells did not run:{gaps}")
            else:
                lines.append(f"coverage matrix ({platform}): all {n} expected cells ran")
        return lines


class Tracker:
    """Gathers cells and expectations from test reports (all phases; repeats are harmless)."""

    def __init__(self):
        self.ran: dict[str, set] = {}
        self.expected: dict[str, set] = {}

    def add(self, report) -> None:
        for name, value in getattr(report, "user_properties", ()):
            if name == CELL_KEY:
                platform, *cell = value
                self.ran.setdefault(platform, set()).add(tuple(cell))
            elif name == EXPECTED_KEY:
                platform, cells = value
                self.expected.setdefault(platform, set()).update(tuple(c) for c in cells)

    def result(self) -> CoverageResult:
        result = CoverageResult()
        for platform, expected in self.expected.items():
            result.checked[platform] = len(expected)
            result.missing[platform] = missing_cells(expected, self.ran.get(platform, set()))
        return result
