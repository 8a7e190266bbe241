"""Real serving engines driven from outside, as users run them: a small Llama-shaped model
made locally (no download), a ``vllm serve`` process with LMCache and this plugin, OpenAI
requests over HTTP. The demo's ``--engine vllm`` mode, ``benchmarks/bench_serving.py`` and
``tests/serving`` stand on it.

Imports only the standard library and this package at import time; the model maker imports
torch, transformers and tokenizers when called, and a server runs in its own interpreter.
"""
