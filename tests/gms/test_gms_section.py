import pytest

from fusekit.report.document import Figure, Table
from fusekit.report.sections.gms import build
from fusekit.report.tour import TourOptions


@pytest.mark.slow  # tests/report/test_tour.py builds the same section and checks the same
def test_tour_section_times_every_named_strategy():
    section = build(TourOptions(seed=1))
    table = next(b for b in section.blocks if isinstance(b, Table))
    impls = [row[0] for row in table.rows]
    assert {"G-Mseg-S", "(GM)seg-S", "G-(MS)seg", "(GMS)seg"} <= set(impls)
    assert any(isinstance(b, Figure) for b in section.blocks)
    assert all(r["max_abs_error"] < 1e-4 for r in section.records)
