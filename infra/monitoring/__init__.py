"""Monitoring: the component that installs collection and dashboards (component.py), the training dashboard as
code (dashboard.py) and the alert rules (alerts.py)."""
