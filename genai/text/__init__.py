"""Text in and out: the tokenizer and its stream, chat templates."""
