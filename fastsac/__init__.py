"""fastsac: NUMA-aware asynchronous FastSAC trainer."""
__version__ = "0.1.0"
