"""The benchmark: HF `generate`, our vLLM port and stock vLLM Llama, measured like for like.

One job a module; imports flow down this list, never up (tests/test_imports.py checks):

- `stats`: speed-ups (one orientation: > 1 means the first-named side is faster), bootstrap
  intervals, verdicts (pure).
- `settings`: what an engine really ran with, read back from it; the like-for-like check of a pair.
- `workload`: rows, workloads, checkpoints.  `profiling`, `step_profile`, `roofline`: measuring
  tools and the memory floor.  `timing`: the synchronised clock, rows of trials, `Progress`.
- `engines`: building and ending each engine.  `hf_probe`: HF's decode step at new vs seen lengths.
- `measure`: the row-by-row measurements in this process (each engine's rows, all its trials in turn).
- `analysis`: pure figures of rows and results: ratios, the curve and its floors, profile digests,
  trial spreads, the curve's targets.
- `results`: the results files: merging parts into a lease file, combining lease files, loading.
- `render`: Markdown tables, a lease's sentences and notes, the README's benchmark sections.
- `runner`: one engine group per process (`measure()` from a notebook, `run` in the process).
- `sides`, `pairs`, `plans`: interleaved comparisons, every side alive in its own process and the
  trials taken in turn; the named plans (the headline's among them).
- `headline`, `plots`: the headline's table, sentences and README block, and the trials' figure,
  from the interleaved result files (`results/pairs/`).
- `faster`: notebook 12's figures: a verification step's cost and the break-even codes per step,
  the bytes FP8 would halve, the FP8 quality and attempts (`results/faster/`), and frame copy
  simulated on the toy world's clips.
- `cli` (`python -m terra_nb.bench`): the command line.
"""
