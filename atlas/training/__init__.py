"""Training machinery: the recipe (`loop.train`, `loop.TrainingRecipe`) with its example stream
(`data`) and metrics log (`run_log`), checkpoints and resume, DeepSpeed, index refresh, and the
MMLU per-subject driver. May import the core of `atlas` (config, model, build, evaluate,
distributed) and the lower packages; never `atlas.cli`, `atlas.serve` or `atlas.demo`."""
