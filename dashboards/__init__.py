"""Grafana dashboards of EB+ Serve, generated from code (``python -m dashboards.generate``)."""
