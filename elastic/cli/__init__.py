"""Command line: `elastic VERB [NOUN]`, thin: parse, call, print."""
