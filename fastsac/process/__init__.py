"""Process start-up shared by every role: binding first, logging, the NUMA check mode.
"""
