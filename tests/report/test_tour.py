from fusekit.report.tour import PARTS, TourOptions, available_sections, run_tour


def test_tour_writes_sections_of_existing_parts_only(tmp_path):
    seen = []
    path = run_tour(tmp_path, TourOptions(seed=1), on_section=lambda p, i, n: seen.append(p))
    page = path.read_text()
    parts = [part for part, _ in available_sections()]
    assert seen == parts
    assert "hw" in parts
    assert "<h2>Hardware</h2>" in page
    assert set(parts) <= set(PARTS)
    # a part without a section module leaves no trace (no placeholder pages)
    assert "not built" not in page.lower() and "coming soon" not in page.lower()
