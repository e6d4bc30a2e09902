"""Anthropic's Messages API shapes: the bodies, their translation into the chat body the OpenAI
endpoints take (one pipeline from there on), and the messages and stream events built from
results."""
