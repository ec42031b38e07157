"""Tools on a finished or running run: fastsac-eval, fastsac-export, videos.
"""
