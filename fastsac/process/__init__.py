"""Process start-up shared by every role: binding first, logging, torch settings, the NUMA check mode.
"""
