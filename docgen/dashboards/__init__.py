"""The generator of EB+ Serve's Grafana dashboards: panels defined in code, rendered to ``dashboards/*.json``.

A checkout tool like the rest of :mod:`docgen` (``python -m docgen.dashboards.generate``): what
operators import into Grafana is the JSON it writes, which the wheel ships as
:mod:`ebplus.dashboards`' data and the chart as a ConfigMap. Imports neither vLLM nor Ray.
"""
