"""Grafana dashboards of EB+ Serve, generated from code (``python -m ebplus.dashboards.generate``)."""
