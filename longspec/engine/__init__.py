"""The engine loop: one generation's model-side state (generation.py), and the step that
drafts, sizes, verifies and commits for one generation or many (batching.py, batch_cost.py)."""
