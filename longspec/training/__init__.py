"""Training: drafters on a frozen target (their data, objectives and loop), and the bundled
demo models with their tokenizer."""
