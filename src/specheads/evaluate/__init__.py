"""Evaluation around the decoder: `specheads eval` and `compare`, the baselines and peers, `--tree auto`
calibration, prompts, reports and plots. Stands on decode/ and heads/; decode/ never imports it."""
