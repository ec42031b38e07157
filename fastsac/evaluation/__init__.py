"""The evaluator role of an async job: deterministic episodes on weights the learner publishes to it.
"""
