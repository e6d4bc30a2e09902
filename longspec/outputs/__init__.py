"""What the text must be and where it ends: grammars, tool calls, detokenization and stop
rules."""
