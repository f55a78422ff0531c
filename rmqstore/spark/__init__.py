"""Spark pipeline for very large stores (Python Data Sources over the shared engine)."""
