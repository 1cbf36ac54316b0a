"""Tour sections, one module per part: ``build(options: TourOptions) -> Section``."""
