import pytest

from fusekit.report import tour
from fusekit.report.document import Figure, Section, Table
from fusekit.report.tour import PARTS, TourOptions, available_sections, run_tour


def test_tour_writes_sections_of_existing_parts_only(tmp_path, monkeypatch):
    seen = []
    built: dict[str, Section] = {}  # each section as its builder returned it

    def kept(part, build):
        def run(options):
            built[part] = build(options)
            return built[part]

        return run

    builders = [(part, kept(part, build)) for part, build in available_sections()]
    monkeypatch.setattr(tour, "available_sections", lambda: builders)
    path = run_tour(tmp_path, TourOptions(seed=1), on_section=lambda p, i, n: seen.append(p))
    page = path.read_text()
    parts = [part for part, _ in available_sections()]
    assert seen == parts
    assert "hw" in parts
    assert "<h2>Hardware</h2>" in page
    assert set(parts) <= set(PARTS)
    # a part without a section module leaves no trace (no placeholder pages)
    assert "not built" not in page.lower() and "coming soon" not in page.lower()
    if "sparse" in parts:  # FuseFlow's fusion table is a table, not a paragraph of cells
        assert '<div class="tabletitle">Fusion table of the GCN' in page
    if "accel" in parts:  # the chosen mapping's ops are named in index notation
        assert "D[m] = max_n C[m,n]" in page
    if "networks" in parts:  # the HF model decodes the same tokens through every experts impl
        assert "same tokens" in page and "DIFFERENT tokens" not in page
    if "stitch" in parts:  # training through torch.compile(backend="fusekit") beside eager
        assert "AdamW steps of a small MLP block" in page
    if "gms" in parts:  # every named strategy timed, and equal to the reference
        gms = built["gms"]
        table = next(b for b in gms.blocks if isinstance(b, Table))
        assert {"G-Mseg-S", "(GM)seg-S", "G-(MS)seg", "(GMS)seg"} <= {row[0] for row in table.rows}
        assert any(isinstance(b, Figure) for b in gms.blocks)
        assert all(r["max_abs_error"] < 1e-4 for r in gms.records)


@pytest.mark.slow  # the tour test runs the same section
def test_the_stitch_section_trains_as_eager_does():
    from fusekit.report.sections.stitch import _training_rows

    rows = _training_rows(seed=3, steps=3)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert max(r["difference"] for r in rows) < 1e-4
    assert rows[0]["loss_eager"] != rows[2]["loss_eager"]  # it trained
