"""The run directory, torch-free (the launcher checks it before it spawns anything): what a run_dir
holds and which run may write into it, its lock, its checkpoint files.
"""
