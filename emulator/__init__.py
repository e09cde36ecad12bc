"""A vLLM stand-in for CPU machines: the token engine served over OpenAI's HTTP API in wall-clock time.

``admit emulate --preset h200-llama3-8b --port 8000`` starts it. One engine loop runs the token engine
(:mod:`admit.engine.token_engine`) against the wall clock and streams every request's tokens as the
engine produces them, so requests interfere with each other exactly as the engine model says (shared
steps, KV-cache pressure, preemptions). See docs/emulator.md.
"""
