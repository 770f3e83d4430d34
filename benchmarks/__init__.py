"""divrl benchmarks: side-by-side ratios, JSON + Markdown out (run with ``make bench``)."""
