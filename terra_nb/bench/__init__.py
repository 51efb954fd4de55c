"""The benchmark: HF `generate`, our vLLM port and stock vLLM Llama, measured like for like.

One way to measure: interleaved pairs. Every side (an engine) lives in a process of its own, all stay
alive, trials are taken in turn, each engine's settings are read back and checked equal but for what
a comparison tests, and every speed-up carries a bootstrap interval.

One job a module; imports flow down this list, never up (tests/test_imports.py checks):

- `stats`: speed-ups (one orientation: > 1 means the first-named side is faster), bootstrap
  intervals, verdicts (pure).
- `settings`: what an engine really ran with, read back from it; the like-for-like check of a pair.
- `workload`: the checkpoints, the sample a trial starts from, the seed's setting.
- `engines`: building and ending each engine.
- `profiling`, `roofline`: the decode-step profile and the memory floor.
  `timing`: the synchronised clock, SDPA limits. (HF's decode step at new vs seen lengths, a one-off
  probe, is `tools/hf_probe.py`.)
- `records`: the committed result files: the newest of a kind, the provenance line, and the earlier
  (non-interleaved) measurements read as they were frozen (`results/earlier/`).
- `sides`, `pairs`, `plans`: the sides a comparison puts against each other, the interleaved runner
  (each side spawned, a hung side stopped by a timeout), the headline's named plans.
- `headline`, `plots`: the benchmark's answer (one verdict on the port against stock, pooled over
  runs of the same port code), the README's and docs' sections that show it, where the port's time
  over stock goes, and their figures, from the interleaved result files (`results/pairs/`).
- `quality`: what a faster setting costs in quality on the toy model.
- `lever_plans`, `guide`: notebook 12's settings guide: the plans that measure every setting
  against the port as it ships, each speed-up read off its interval, the quality it costs, where a
  decode step's time goes (the step profile), and frame copy's break-even.
- `drafter`: the learned drafter (vLLM's `draft_model`) against the port, on the toy model and Terra's shape.
- `cli` (`python -m terra_nb.bench`): the command line. `docs` (`python -m terra_nb.bench.docs`):
  every generated section of the README and docs/, and the command that refreshes them.
"""
