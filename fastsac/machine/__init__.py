"""The machine: NUMA topology, CPU/memory binding, placement plans for collectors, learners and the
evaluator, learner ranks. Torch-free.
"""
