"""What may be generated: grammar guidance (llguidance), tool calls turned into grammars and
parsed back, stop strings."""
