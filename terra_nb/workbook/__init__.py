"""Workbook tooling: rendering, results, the papermill runner, the benchmark and its profiler.

`show` and `viz` (source, shapes, figures), `results` and `reproduce` (`make reproduce` and its
report), `docs` (every generated section of the README and docs/, from the result files), `bench` and `profiling` (the GPU benchmark), `paths` and `data` (where things live, the
sample inputs), `checkpoints` (random-weight checkpoints in the released format), and the
notebook kernels' setup for papermill (`reproduce`; nbval's plugin and the
kernels' output stream are `terra_nb_kernel`'s, outside this package so that they import no torch).
"""
