"""The accel section's COMET tables: loop nest, reads and writes per level, cycles per unit."""

from __future__ import annotations

from fusekit.accel.comet import evaluate
from fusekit.report.sections.accel import _EXAMPLES, comet_blocks


def test_comet_blocks_of_the_shipped_gemm_softmax_example():
    case = _EXAMPLES / "gemm_softmax_edge"  # 1x1024x128 on edge, 8-bit GEMM tensors
    nest, moved, units = comet_blocks(case, "example")
    out = evaluate(case)
    assert len(nest.rows) == len(out["nest"])
    assert nest.rows[1][1] == "spatial" and "N2 x N2 (DRAM->GB)" in nest.rows[1][2]
    dram = {row[1]: row for row in moved.rows if row[0] == "DRAM"}
    assert dram["B"][2:4] == (1, 128 * 1024)  # B read from DRAM once: K x N bytes
    assert dram["H"][4:] == (1, 1024)  # the result written once
    assert sum(row[-1] for row in units.rows) == out["total_cycles"]
