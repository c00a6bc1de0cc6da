"""Tools the benchmarks and the docs' figures use, apart from the library: the analytic FLOP count,
the TPU compiler's estimate of a step's time, and learning-curve plots."""
