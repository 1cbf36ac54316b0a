import pytest

from fusekit.report.document import Table, Text
from fusekit.report.sections.ir import build
from fusekit.report.tour import TourOptions

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")


def test_ir_section_reports_every_builtin_model():
    section = build(TourOptions(seed=0))
    models, samples, chains = section.blocks
    assert isinstance(models, Table) and isinstance(samples, Table) and isinstance(chains, Text)
    by_model = {r["model"]: r for r in section.records}
    assert list(by_model) == ["bert", "gpt_moe", "gcn", "rgcn"]
    assert all(r["max_abs_error"] < 1e-4 for r in section.records)
    assert by_model["gpt_moe"]["opaque"] == 2 and by_model["bert"]["opaque"] == 0
    assert by_model["rgcn"]["gms_chains"] == 1 and by_model["gpt_moe"]["gms_chains"] == 1
    assert ("gcn", "contraction (sparse operand)") in {row[:2] for row in samples.rows}
