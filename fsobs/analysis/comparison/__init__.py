"""A/B comparison of analyzed runs: one control against one test (:mod:`.ab`), and interleaved
pairs of them with medians and intervals (:mod:`.pairs`)."""
