"""Test helpers that ship with tracelab: synthetic multi-rank traces with known answers.

See tracelab.testing.synth. Nothing here is imported by `import tracelab`.
"""
