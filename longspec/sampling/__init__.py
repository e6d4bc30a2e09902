"""Sampling: its settings and the one logits-processing function (logits.py), the sampler
that draws with them (sampler.py), penalties and position-keyed noise."""
