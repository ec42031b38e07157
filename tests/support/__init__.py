"""Helpers of the tests (imported as `support.<module>`: pytest puts tests/ on sys.path for the
conftest there), the test-only hooks of fault_hooks/ (put on a job's PYTHONPATH) and the scripts that
tools/numa-vm runs in its guest. Nothing here is collected as a test."""
